"""Lossless verification of one draft against the target (pure torch, no model, no Ray).

Greedy: accept the longest prefix of the draft equal to the target's argmax, then emit the
target's own next token. Sampling (Leviathan et al. / Chen et al.): accept x_j with probability
min(1, p_j(x_j) / q_j(x_j)); at the first rejection emit a sample of norm(max(0, p_j - q_j));
if every drafted token is accepted, emit a bonus token from p_{d+1}. A point-mass drafter
(q = None) has q_j = one_hot(x_j).

Also computes the per-position overlap Σ_v min(p_j(v), q_j(v)) = 1 - TV(p_j, q_j) over ALL drafted
positions: the terms of the BD reward (policy/reward.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from actors.proposal import SparseDist
from actors.sampling import SamplingParams, warp_probs


@dataclass(frozen=True)
class Verification:
    """Outcome of one round: `token_ids` = accepted drafts + one recovered or bonus token."""

    accepted: int
    token_ids: tuple[int, ...]
    num_drafted: int
    overlaps: tuple[float, ...]  # per drafted position: Σ_v min(p_j(v), q_j(v))


def dense_q(q: Sequence[SparseDist] | None, draft: Sequence[int], vocab: int) -> torch.Tensor:
    """Dense draft distributions. -> [d, V]; a point mass (q None) puts 1.0 on each drafted token."""
    out = torch.zeros(len(draft), vocab)
    if q is None:
        out[torch.arange(len(draft)), torch.tensor(draft, dtype=torch.long)] = 1.0
        return out
    for j, dist in enumerate(q):
        out[j, torch.tensor(dist.ids, dtype=torch.long)] = torch.tensor(dist.probs, dtype=torch.float32)
    return out


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)). p, q: [V] -> [V]. Falls back to p when p <= q everywhere (measure zero)."""
    residual = torch.clamp(p - q, min=0.0)
    total = residual.sum()
    return residual / total if total > 0 else p


def greedy_accept(draft: Sequence[int], target_logits: torch.Tensor) -> tuple[int, list[int]]:
    """target_logits: [d+1, V]. -> (accepted, accepted drafts + the target's next token)."""
    target_ids = target_logits.argmax(dim=-1).tolist()
    accepted = 0
    while accepted < len(draft) and draft[accepted] == target_ids[accepted]:
        accepted += 1
    return accepted, list(draft[:accepted]) + [target_ids[accepted]]


def speculative_accept(
    draft: Sequence[int], p: torch.Tensor, q: torch.Tensor, generator: torch.Generator
) -> tuple[int, list[int]]:
    """p: [d+1, V] target probabilities, q: [d, V] draft probabilities (after the same warp).

    -> (accepted, emitted tokens). The emitted sequence is distributed exactly as sampling p.
    """
    uniforms = torch.rand(len(draft), generator=generator).tolist()
    for j, token in enumerate(draft):
        p_x, q_x = float(p[j, token]), float(q[j, token])
        if uniforms[j] * q_x < p_x:  # accept with probability min(1, p/q)
            continue
        recovered = torch.multinomial(residual_distribution(p[j], q[j]), 1, generator=generator)
        return j, list(draft[:j]) + [int(recovered)]
    bonus = torch.multinomial(p[len(draft)], 1, generator=generator)
    return len(draft), list(draft) + [int(bonus)]


def verify(
    draft: Sequence[int],
    q: Sequence[SparseDist] | None,
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator,
    with_overlaps: bool = True,
    p: torch.Tensor | None = None,
) -> Verification:
    """Verify one draft. target_logits: [d+1, V], row j = target logits for draft position j.

    `with_overlaps=False` skips the BD terms (greedy rounds then need no softmax at all).
    p: [>= d+1, V] `warp_probs(target_logits, sampling)` when the caller has it (computed here
    otherwise, only where needed).
    """
    d, vocab = len(draft), target_logits.shape[-1]
    if sampling.greedy:
        accepted, emitted = greedy_accept(draft, target_logits)
        if not with_overlaps:
            return Verification(accepted=accepted, token_ids=tuple(emitted), num_drafted=d, overlaps=())
        p = warp_probs(target_logits[:d], sampling) if p is None else p  # at temperature 1, for the BD terms
        q_dense = None if q is None else dense_q(q, draft, vocab)  # [d, V]
    else:
        p = warp_probs(target_logits, sampling) if p is None else p  # [d+1, V]
        q_dense = dense_q(q, draft, vocab)  # [d, V]
        accepted, emitted = speculative_accept(draft, p, q_dense, generator)
    overlaps = draft_overlaps(draft, q, p[:d], q_dense) if with_overlaps else ()
    return Verification(accepted=accepted, token_ids=tuple(emitted), num_drafted=d, overlaps=overlaps)


def draft_overlaps(
    draft: Sequence[int], q: Sequence[SparseDist] | None, p: torch.Tensor, q_dense: torch.Tensor | None = None
) -> tuple[float, ...]:
    """Σ_v min(p_j(v), q_j(v)) per drafted position. p: [d, V] the target's (warped) probabilities
    at the drafted positions; q_dense: [d, V] when already built. A point mass scores p_j(x_j)."""
    d = len(draft)
    if d == 0:
        return ()
    if q is None:
        return tuple(p[torch.arange(d), torch.tensor(draft, dtype=torch.long)].tolist())
    q_dense = dense_q(q, draft, p.shape[-1]) if q_dense is None else q_dense
    return tuple(torch.minimum(p[:d], q_dense).sum(dim=-1).tolist())
