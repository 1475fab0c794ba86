"""Sequential halving (Karnin et al.) over a per-request budget of B rounds, then exploit:

    with S_0 = all arms and R = ceil(log2 K) phases, phase r pulls each arm of S_r
    max(1, floor(B / (|S_r| R))) times, then keeps the better half of S_r by mean reward
    (means over this request's own pulls). After the last phase the survivor is pulled.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from policy.bandit import ArmStats, Bandit


@dataclass(frozen=True)
class SequentialHalvingConfig:
    budget: int = 24

    def __post_init__(self) -> None:
        if self.budget < 1:
            raise ValueError(f"budget must be >= 1, got {self.budget}")


class SequentialHalving(Bandit):
    def __init__(self, arms, rng, prior=None, prior_weight: float = 0.0, config: SequentialHalvingConfig = SequentialHalvingConfig()) -> None:
        super().__init__(arms, rng, prior, prior_weight)
        self.config = config
        self._start_phase(list(self.stats))

    def _start_phase(self, survivors: list[str]) -> None:
        self.survivors = survivors
        self.phase_stats = {arm: ArmStats() for arm in survivors}
        phases = max(1, math.ceil(math.log2(max(len(self.stats), 2))))
        self.pulls_per_arm = max(1, self.config.budget // (len(survivors) * phases))

    def add_arm(self, arm, prior=None, prior_weight: float = 0.0) -> None:
        super().add_arm(arm, prior, prior_weight)
        if hasattr(self, "survivors"):
            self._start_phase(self.survivors + [arm])

    def remove_arm(self, arm: str) -> None:
        super().remove_arm(arm)
        survivors = [a for a in self.survivors if a != arm] or list(self.stats)
        self._start_phase(survivors)

    def update(self, arm: str, reward: float, pulled: bool = True, weight: float = 1.0) -> None:
        super().update(arm, reward, pulled, weight)
        if arm in self.phase_stats:
            self.phase_stats[arm].add(float(reward))
        if len(self.survivors) > 1 and all(s.pulls >= self.pulls_per_arm for s in self.phase_stats.values()):
            keep = math.ceil(len(self.survivors) / 2)
            self._start_phase(self.top({a: s.mean for a, s in self.phase_stats.items()}, keep))

    def select(self, n: int = 1) -> list[str]:
        if len(self.survivors) == 1:
            return self.survivors[:1]
        least = {a: -self.phase_stats[a].pulls for a in self.survivors}
        return self.top(least, n)
