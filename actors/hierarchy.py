"""Hierarchy drafter: draft from the most local source that has something to say.

In the spirit of Hierarchy Drafting: the request's own context (n-gram), then past requests
(suffix cache), then a model drafter if one is configured. Each source keeps its own sessions;
this class forwards to each source exactly the committed tokens it has not seen yet.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from actors.proposal import Proposal, Proposer
from actors.sampling import SamplingParams
from actors.session import SessionStore


class HierarchyProposer:
    def __init__(self, sources: Sequence[Proposer], name: str = "hierarchy") -> None:
        self.name = name
        self.sources = list(sources)
        self.model_free = all(getattr(source, "model_free", False) for source in self.sources)
        self.sessions = SessionStore()

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        entry = self.sessions.extend(session, context_delta, new_state=lambda: [0] * len(self.sources))
        sent: list[int] = entry.state
        for index, source in enumerate(self.sources):
            proposal = source.propose(session, entry.tokens[sent[index] :], k, sampling)
            sent[index] = len(entry.tokens)
            if proposal.token_ids:
                return replace(proposal, drafter=self.name, source=proposal.drafter, draft_s=time.perf_counter() - start)
        return Proposal(drafter=self.name, draft_s=time.perf_counter() - start)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        entry = self.sessions.extend(session, context_delta, new_state=lambda: [0] * len(self.sources))
        self.sessions.pop(session)
        for index, source in enumerate(self.sources):
            source.release(session, entry.tokens[entry.state[index] :])
