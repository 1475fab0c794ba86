"""Sliding-window UCB (Garivier & Moulines): UCB over the last `window` rounds only, so the
policy follows a drafter whose quality changes mid-request (a task switch):

    mean_i^W + beta * sqrt(2 ln min(t, W) / n_i^W)

Arms with no pull inside the window are tried first.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from policy.bandit import Bandit


@dataclass(frozen=True)
class SlidingWindowUCBConfig:
    window: int = 24
    beta: float = 0.5

    def __post_init__(self) -> None:
        if self.window < 1:
            raise ValueError(f"window must be >= 1, got {self.window}")
        if not (self.beta >= 0 and math.isfinite(self.beta)):
            raise ValueError(f"beta must be finite and >= 0, got {self.beta}")


class SlidingWindowUCB(Bandit):
    def __init__(self, arms, rng, prior=None, prior_weight: float = 0.0, config: SlidingWindowUCBConfig = SlidingWindowUCBConfig()) -> None:
        super().__init__(arms, rng, prior, prior_weight)
        self.config = config
        self.recent: deque[tuple[str, float]] = deque(maxlen=config.window)

    def update(self, arm: str, reward: float, pulled: bool = True, weight: float = 1.0) -> None:
        super().update(arm, reward, pulled, weight)
        self.recent.append((arm, float(reward)))

    def select(self, n: int = 1) -> list[str]:
        pulls = {arm: 0 for arm in self.stats}
        sums = {arm: 0.0 for arm in self.stats}
        for arm, reward in self.recent:
            if arm in pulls:
                pulls[arm] += 1
                sums[arm] += reward
        horizon = max(min(len(self.recent), self.config.window), 1)
        scores = {}
        for arm in self.stats:
            if pulls[arm] == 0:  # untried in the window: prior mean as a tie-break, explored first
                scores[arm] = math.inf if self.stats[arm].pulls == 0 else 10.0 + self.stats[arm].mean
            else:
                bonus = self.config.beta * math.sqrt(2 * math.log(horizon) / pulls[arm]) if horizon > 1 else 0.0
                scores[arm] = sums[arm] / pulls[arm] + bonus
        return self.top(scores, n)
