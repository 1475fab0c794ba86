"""EXP3 (Auer et al.), the adversarial bandit. With K arms and weights w_i:

    P(i) = (1 - gamma) * w_i / Σ_j w_j + gamma / K
    after reward r on the chosen arm a:  w_a <- w_a * exp(gamma * (r / P(a)) / K)

Weights are kept in log space. A warm-start prior sets log w_i = gamma * pulls_i * mean_i / K.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from policy.bandit import Bandit


@dataclass(frozen=True)
class EXP3Config:
    gamma: float = 0.1

    def __post_init__(self) -> None:
        if not 0 < self.gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")


class EXP3(Bandit):
    def __init__(self, arms, rng, prior=None, prior_weight: float = 0.0, config: EXP3Config = EXP3Config()) -> None:
        super().__init__(arms, rng, prior, prior_weight)
        self.config = config
        k = len(self.stats)
        self.log_weights = {a: config.gamma * s.reward_sum / k for a, s in self.stats.items()}

    def add_arm(self, arm, prior=None, prior_weight: float = 0.0) -> None:
        super().add_arm(arm, prior, prior_weight)
        if hasattr(self, "log_weights"):
            self.log_weights[arm] = max(self.log_weights.values(), default=0.0)  # explore the newcomer

    def remove_arm(self, arm: str) -> None:
        super().remove_arm(arm)
        self.log_weights.pop(arm, None)

    def probabilities(self) -> dict[str, float]:
        arms = list(self.stats)
        logw = np.array([self.log_weights[a] for a in arms])
        w = np.exp(logw - logw.max())
        gamma, k = self.config.gamma, len(arms)
        probs = (1 - gamma) * w / w.sum() + gamma / k
        return dict(zip(arms, probs.tolist()))

    def select(self, n: int = 1) -> list[str]:
        probs = self.probabilities()
        arms = list(probs)
        n = max(1, min(n, len(arms)))
        picked = self.rng.choice(len(arms), size=n, replace=False, p=np.array(list(probs.values())))
        return [arms[i] for i in picked]

    def update(self, arm: str, reward: float, pulled: bool = True, weight: float = 1.0) -> None:
        if arm not in self.stats:
            return
        p = self.probabilities()[arm] if pulled else 1.0  # an observation not drawn needs no importance weight
        super().update(arm, reward, pulled, weight)
        self.log_weights[arm] += self.config.gamma * (reward / p) / len(self.stats)
