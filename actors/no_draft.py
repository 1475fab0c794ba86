"""The no-draft arm: proposes nothing, so the round is one plain target step.

It lets a cost-aware policy decide that speculation does not pay for this request right now.
"""
from __future__ import annotations

from collections.abc import Sequence

from actors.proposal import Proposal
from actors.sampling import SamplingParams

NO_DRAFT = "none"


class NoDraftProposer:
    model_free = False  # drafts nothing: nothing to score

    def __init__(self, name: str = NO_DRAFT) -> None:
        self.name = name

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        return Proposal(drafter=self.name)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        return None
