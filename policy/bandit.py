"""Shared bandit state: arms keyed by name, per-arm pull counts and reward sums, warm start.

Every policy subclasses `Bandit` and implements `select(n)`; `update(arm, reward)` records a
reward in [0, 1]. `t` counts pulls; an observation of an arm that was not pulled (counterfactual
feedback, `pulled=False`) adds to the arm's statistics but not to `t`, so free observations do
not inflate the exploration bonus of the arms that must be pulled to be seen. `weight` counts an
observation as that many pulls: the cost reward weighs each round by its duration (in plain
steps), so an arm's mean is its throughput, Σ tokens / Σ seconds, not the mean of its rounds'
rates (which flatters an arm whose rounds are sometimes cheap and often slow).

`prior` (global statistics across requests) warm-starts a per-request bandit: each arm starts
with min(prior pulls, prior_weight) pseudo-pulls at the prior mean (one weight for every arm, or
one per arm), so a new
request does not re-explore what earlier requests already measured. Randomness comes only from
the injected numpy Generator.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class ArmStats:
    pulls: float = 0.0
    reward_sum: float = 0.0

    @property
    def mean(self) -> float:
        return self.reward_sum / self.pulls if self.pulls else 0.0

    def add(self, reward: float, weight: float = 1.0) -> None:
        self.pulls += weight
        self.reward_sum += reward * weight


class Bandit(ABC):
    def __init__(
        self,
        arms: Sequence[str],
        rng: np.random.Generator,
        prior: Mapping[str, ArmStats] | None = None,
        prior_weight: float | Mapping[str, float] = 0.0,
    ) -> None:
        if not arms:
            raise ValueError("a bandit needs at least one arm")
        if len(set(arms)) != len(arms):
            raise ValueError(f"duplicate arms in {list(arms)}")
        self.rng = rng
        self.stats: dict[str, ArmStats] = {}
        self.t = 0.0  # total (pseudo-)pulls
        for arm in arms:
            weight = prior_weight.get(arm, 0.0) if isinstance(prior_weight, Mapping) else prior_weight
            self.add_arm(arm, prior.get(arm) if prior else None, weight)

    @property
    def arms(self) -> list[str]:
        return list(self.stats)

    def add_arm(self, arm: str, prior: ArmStats | None = None, prior_weight: float = 0.0) -> None:
        if arm in self.stats:
            raise ValueError(f"arm {arm!r} already exists")
        weight = min(prior.pulls, prior_weight) if prior is not None else 0.0
        self.stats[arm] = ArmStats(weight, prior.mean * weight if prior is not None else 0.0)
        self.t += weight

    def remove_arm(self, arm: str) -> None:
        if len(self.stats) == 1:
            raise ValueError("cannot remove the last arm")
        self.t -= self.stats.pop(arm).pulls

    def update(self, arm: str, reward: float, pulled: bool = True, weight: float = 1.0) -> None:
        if arm in self.stats:  # an arm removed mid-round just loses its feedback
            self.stats[arm].add(float(reward), weight)
            self.t += weight if pulled else 0.0

    @abstractmethod
    def select(self, n: int = 1) -> list[str]:
        """The arm(s) to pull this round, best first."""

    def untried(self) -> list[str]:
        return [arm for arm, s in self.stats.items() if s.pulls == 0]

    def top(self, scores: Mapping[str, float], n: int) -> list[str]:
        """The n best arms by score; ties broken at random (seeded)."""
        arms = list(scores)
        jitter = self.rng.random(len(arms)) * 1e-12
        order = np.argsort([-(scores[a] + e) for a, e in zip(arms, jitter)], kind="stable")
        return [arms[i] for i in order[: max(1, min(n, len(arms)))]]

    def explore_first(self, n: int) -> list[str] | None:
        """Phase 1 of UCB-style policies: arms never pulled go first (in random order)."""
        untried = self.untried()
        if not untried:
            return None
        picked = [untried[i] for i in self.rng.permutation(len(untried))][:n]
        if len(picked) < n:
            picked += [a for a in self.top({a: s.mean for a, s in self.stats.items()}, n) if a not in picked][: n - len(picked)]
        return picked
