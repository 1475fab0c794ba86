"""Always the same arm (`fixed:<drafter>`): single-drafter speculation as a policy."""
from __future__ import annotations

from policy.bandit import Bandit


class FixedArm(Bandit):
    def __init__(self, arms, rng, prior=None, prior_weight: float = 0.0, arm: str | None = None) -> None:
        super().__init__(arms, rng, prior, prior_weight)
        self.arm = arm if arm is not None else self.arms[0]
        if self.arm not in self.stats:
            raise ValueError(f"fixed arm {self.arm!r} is not among {self.arms}")

    def select(self, n: int = 1) -> list[str]:
        return [self.arm]
