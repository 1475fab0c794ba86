"""Thompson sampling with Beta posteriors and fractional (Bernoulli-relaxed) rewards in [0, 1]:

    theta_i ~ Beta(1 + Σ r_i, 1 + n_i - Σ r_i);  pick the arm(s) with the largest theta_i.
"""
from __future__ import annotations

from policy.bandit import Bandit


class Thompson(Bandit):
    def select(self, n: int = 1) -> list[str]:
        scores = {
            arm: float(self.rng.beta(1.0 + s.reward_sum, 1.0 + max(s.pulls - s.reward_sum, 0.0)))
            for arm, s in self.stats.items()
        }
        return self.top(scores, n)
