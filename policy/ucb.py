"""UCB1 as in MetaSD-UCB: try each arm once, then pick the arm maximising

    mean_i + beta * sqrt(2 ln t / n_i)

where t is the total number of pulls and n_i the pulls of arm i. The reward (BD, BE or cost) is
chosen by the policy name in policy/registry.py; the algorithm is the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from policy.bandit import Bandit


@dataclass(frozen=True)
class UCBConfig:
    beta: float = 0.5

    def __post_init__(self) -> None:
        if not (self.beta >= 0 and math.isfinite(self.beta)):
            raise ValueError(f"beta must be finite and >= 0, got {self.beta}")


class UCB(Bandit):
    def __init__(self, arms, rng, prior=None, prior_weight: float = 0.0, config: UCBConfig = UCBConfig()) -> None:
        super().__init__(arms, rng, prior, prior_weight)
        self.config = config

    def index(self, arm: str) -> float:
        s = self.stats[arm]
        return s.mean + self.config.beta * math.sqrt(2 * math.log(max(self.t, 1.0)) / s.pulls)

    def select(self, n: int = 1) -> list[str]:
        first = self.explore_first(n)
        if first is not None:
            return first
        return self.top({arm: self.index(arm) for arm in self.stats}, n)
