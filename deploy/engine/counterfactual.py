"""Counterfactual scoring of shadow drafts (the `counterfactual` and `tree` verification modes):
drafts the target never verified, scored against the output as later rounds commit it.

A shadow drafted in round t proposes tokens for the same positions as round t's verified draft.
Its tokens count as accepted as far as they match the committed output, however many rounds that
output takes to arrive: a draft longer than what round t's chosen drafter got accepted is
followed into the next rounds instead of being cut at round t's output (which would score every
shadow no better than the drafter that happened to be chosen). Under greedy decoding the output
is the target's argmax path, so the count equals what verification would have accepted; under
sampling a point-mass token matches the output with probability p(x), its acceptance probability.

BD terms come from the target's distribution at each position on the output's path: every
matched token and the first mismatch are scored; positions after a mismatch (whose context is the
shadow's own, never computed) count 0, a lower bound. A shadow still open when the request ends
is scored on the positions the output reached.

`CounterfactualScorer` holds one request's open shadows: `add` them when drafted, `observe` each
round's committed tokens with the target's logits for them, `finish` at the end; both return the
shadows whose score is final.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from actors.proposal import Proposal
from deploy.engine.verify import draft_overlaps


@dataclass
class ShadowScore:
    """One shadow draft's score so far: `matched` tokens of it equal the output; `overlaps` holds
    its BD terms for the positions scored (the matched ones and the first mismatch)."""

    proposal: Proposal
    start: int  # position in the request's sequence of its first drafted token
    matched: int = 0
    overlaps: list[float] = field(default_factory=list)
    done: bool = False

    @property
    def next_position(self) -> int:
        return self.start + self.matched


class CounterfactualScorer:
    def __init__(self, with_overlaps: bool) -> None:
        self.with_overlaps = with_overlaps
        self.open: list[ShadowScore] = []

    def add(self, shadows: Sequence[Proposal], start: int) -> list[ShadowScore]:
        """Shadows drafted for the positions from `start` on. -> the empty ones (final at once)."""
        scores = [ShadowScore(s, start, done=not s.token_ids) for s in shadows]
        self.open += [s for s in scores if not s.done]
        return [s for s in scores if s.done]

    def observe(self, start: int, committed: Sequence[int], target_probs: Callable[[int], torch.Tensor]) -> list[ShadowScore]:
        """The round committed `committed` at positions start, start+1, ...; `target_probs(i)` is
        the target's (warped) distribution [V] that committed[i] came from. -> the shadows whose
        score became final (a mismatch, or the whole draft matched)."""
        final = []
        for shadow in self.open:
            draft = shadow.proposal.token_ids
            while not shadow.done and start <= shadow.next_position < start + len(committed):
                i, j = shadow.next_position - start, shadow.matched
                if self.with_overlaps:
                    q = shadow.proposal.q[j : j + 1] if shadow.proposal.q is not None else None
                    shadow.overlaps += draft_overlaps(draft[j : j + 1], q, target_probs(i)[None])
                if draft[j] == committed[i]:
                    shadow.matched += 1
                    shadow.done = shadow.matched == len(draft)
                else:
                    shadow.done = True
            if shadow.done:
                final.append(shadow)
        self.open = [s for s in self.open if not s.done]
        return final

    def finish(self) -> list[ShadowScore]:
        """The request is over: every open shadow is scored on what the output reached."""
        final, self.open = self.open, []
        for shadow in final:
            shadow.done = True
        return final
