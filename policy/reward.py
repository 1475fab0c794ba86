"""Rewards for one speculation round, all in [0, 1] (pure functions).

- BE, block efficiency:  accepted / drafted  (0 when nothing was drafted).
- BD, block divergence (MetaSD's alignment feedback):  (1/d) Σ_{j=1..d} Σ_v min(p_j(v), q_j(v)),
  the mean of 1 - TV(p_j, q_j) over ALL drafted positions, including those after the first
  rejection. Under greedy decoding p and q are temperature-1 softmaxes; a model-free drafter is a
  point mass, so its term is p_j(x_j). 0 when nothing was drafted.
- COST (beyond the paper; our drafters differ in speed): the round's tokens per second,
  (accepted + 1) / (draft_s + verify_s), divided by the best rate a round could reach, (k + 1)
  tokens at the cost of one plain target step, and clipped to [0, 1]:
      r = clip((accepted + 1) * plain_step_s / ((draft_s + verify_s) * (k + 1)), 0, 1).
  A plain step (the no-draft arm) scores ≈ 1 / (k + 1), so speculation that does not pay
  scores below doing nothing.
"""
from __future__ import annotations

from collections.abc import Sequence

BE, BD, COST = "be", "bd", "cost"
REWARD_KINDS = (BE, BD, COST)


def block_efficiency(accepted: int, drafted: int) -> float:
    return accepted / drafted if drafted else 0.0


def block_divergence(overlaps: Sequence[float]) -> float:
    return min(1.0, max(0.0, sum(overlaps) / len(overlaps))) if overlaps else 0.0


def cost_reward(accepted: int, draft_s: float, verify_s: float, plain_step_s: float, k: int) -> float:
    seconds = max(draft_s + verify_s, 1e-9)
    return min(1.0, max(0.0, (accepted + 1) * plain_step_s / (seconds * (k + 1))))


def round_reward(
    kind: str,
    *,
    accepted: int,
    drafted: int,
    overlaps: Sequence[float],
    draft_s: float,
    verify_s: float,
    plain_step_s: float,
    k: int,
) -> float:
    if kind == BE:
        return block_efficiency(accepted, drafted)
    if kind == BD:
        return block_divergence(overlaps)
    if kind == COST:
        return cost_reward(accepted, draft_s, verify_s, plain_step_s, k)
    raise ValueError(f"unknown reward kind {kind!r}; known: {REWARD_KINDS}")
