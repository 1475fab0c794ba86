"""Acceptance: one target forward's logits decide, losslessly, which drafted tokens a request
keeps. One entry, `accept`, for both shapes of a round: a single draft (or none: a plain step) is
verified by rejection sampling (deploy/engine/verify.py), several drafts as a token tree by
recursive rejection (deploy/engine/tree_verify.py). The request's cache keeps the accepted path
only. The `Verdict` says what was emitted, what each verified draft earned (its accepted tokens
and, for the BD reward, its overlaps with p), and where each emitted token's distribution sits
in the forward (for the shadows' scores and the eagle drafter's features)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from actors.sampling import SamplingParams, warp_probs
from deploy.engine.logprobs import TokenLogprob, token_logprobs
from deploy.engine.planner import ForwardPlan
from deploy.engine.request import RequestState
from deploy.engine.slot_kv import SlotKV
from deploy.engine.tree_verify import per_draft_outcome, verify_tree
from deploy.engine.verify import draft_overlaps, verify
from policy.coordinator import DraftRound


@dataclass(frozen=True)
class DraftOutcome:
    """What one verified draft earned: its tokens accepted and its BD overlaps."""

    accepted: int
    overlaps: tuple[float, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """What one target forward decided."""

    emitted: tuple[int, ...]  # accepted tokens + the recovered or bonus token
    drafted: int  # positions verified (a tree's distinct nodes)
    outcomes: tuple[DraftOutcome, ...]  # per verified proposal, in order
    p: torch.Tensor | None  # [rows, V] the target's warped probabilities (None when nothing needs them)
    branch_rows: tuple[int, ...]  # the forward's row of each emitted token's distribution
    chain_size: int  # the forward's size when it verified one draft or none (0 for a tree)
    verify_s: float
    logprobs: tuple[TokenLogprob, ...] = ()  # per emitted token, when the request asked for them

    @property
    def accepted(self) -> int:
        return len(self.emitted) - 1


def accept(kv: SlotKV, request: RequestState, chosen: DraftRound, plan: ForwardPlan, logits: torch.Tensor,
           verify_s: float, with_overlaps: bool) -> Verdict:
    """Accept from the forward's logits (the request's rows) losslessly; the cache keeps the accepted
    path only. with_overlaps: compute each draft's BD overlaps with p (the BD reward)."""
    tokens, sampling, distinct, tree = request.tokens, request.sampling, plan.distinct, plan.tree
    needs_p = with_overlaps or not sampling.greedy
    if tree is None:
        draft, q = (distinct[0].token_ids, distinct[0].q) if distinct else ((), None)
        logits = logits[: len(draft) + 1]  # [d+1, V]
        p = warp_probs(logits, sampling) if needs_p else None  # [d+1, V]
        result = verify(draft, q, logits, sampling, request.generator, with_overlaps=with_overlaps, p=p)
        kv.crop(request.cache, len(tokens) + result.accepted)
        outcomes = tuple(
            DraftOutcome(0) if not proposal.token_ids
            else DraftOutcome(result.accepted, result.overlaps if proposal.q is q or not with_overlaps
                              else draft_overlaps(draft, proposal.q, p[: len(draft)]))
            for proposal in chosen.proposals
        )
        rows = tuple(range(result.accepted + 1))
        return Verdict(result.token_ids, len(draft), outcomes, p, rows, len(plan.row.token_ids), verify_s,
                       _logprobs(logits, rows, result.token_ids, sampling))
    drafts = [p.token_ids for p in distinct]
    logits = logits[: 1 + tree.size]  # [1+n, V]
    p = warp_probs(logits, sampling) if needs_p else None  # [1+n, V]
    result = verify_tree(tree, [d.q for d in distinct], drafts, logits, sampling, request.generator, p=p)
    kv.keep(request.cache, len(tokens), [len(tokens) + node for node in result.nodes])
    index = {proposal.token_ids: i for i, proposal in enumerate(distinct)}
    outcomes = tuple(
        DraftOutcome(*per_draft_outcome(tree, index[proposal.token_ids], proposal.token_ids, proposal.q,
                                        p if with_overlaps else None, result))
        if proposal.token_ids else DraftOutcome(0)
        for proposal in chosen.proposals
    )
    rows = (0, *(1 + node for node in result.nodes))
    return Verdict(result.token_ids, tree.size, outcomes, p, rows, 0, verify_s,
                   _logprobs(logits, rows, result.token_ids, sampling))


def _logprobs(logits: torch.Tensor, rows: Sequence[int], emitted: Sequence[int],
              sampling: SamplingParams) -> tuple[TokenLogprob, ...]:
    if sampling.logprobs is None:
        return ()
    return token_logprobs(logits, rows, emitted, sampling.logprobs)
