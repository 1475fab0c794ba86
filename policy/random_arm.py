"""Uniformly random arm(s) each round: the baseline every learning policy must beat."""
from __future__ import annotations

from policy.bandit import Bandit


class RandomArm(Bandit):
    def select(self, n: int = 1) -> list[str]:
        arms = self.arms
        n = max(1, min(n, len(arms)))
        return [arms[i] for i in self.rng.choice(len(arms), size=n, replace=False)]
