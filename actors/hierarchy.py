"""Hierarchy drafter: draft from the most local source that has something to say.

In the spirit of Hierarchy Drafting: the request's own context (n-gram), then past requests
(suffix cache), then a model drafter if one is configured. Each source keeps its own sessions;
this class forwards to each source exactly the committed tokens it has not seen yet. A model
source's drafting ahead (actors/hf.py) passes through: `set_draft_ahead`, `ready`, and its
`ahead_s` kept out of the hierarchy's `draft_s`.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

from actors.proposal import Proposal, Proposer
from actors.session import SessionStore
from deploy.sampling import SamplingParams


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
                return replace(proposal, drafter=self.name, source=proposal.drafter,
                               draft_s=time.perf_counter() - start - proposal.ahead_s)
        return Proposal(drafter=self.name, draft_s=time.perf_counter() - start)

    def set_draft_ahead(self, tokens: int, in_background: bool = False) -> None:
        """Its model source, if any, drafts ahead (actors/hf.py)."""
        for source in self.sources:
            if hasattr(source, "set_draft_ahead"):
                source.set_draft_ahead(tokens, in_background)

    def offer(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        """What its model sources drafted ahead for this context (actors/hf.py `offer`), the first
        that has some; each is offered the context, so it drafts ahead from it. Its other sources
        are not asked (they catch up when it next drafts)."""
        start = time.perf_counter()
        entry = self.sessions.extend(session, context_delta, new_state=lambda: [0] * len(self.sources))
        sent: list[int] = entry.state
        found, ahead_s = None, 0.0
        for index, source in enumerate(self.sources):
            if not hasattr(source, "offer"):
                continue
            proposal = source.offer(session, entry.tokens[sent[index] :], k, sampling)
            sent[index] = len(entry.tokens)
            ahead_s += proposal.ahead_s
            if found is None and proposal.token_ids:
                found = proposal
        draft_s = time.perf_counter() - start - ahead_s
        if found is None:
            return Proposal(drafter=self.name, draft_s=draft_s, ahead_s=ahead_s)
        return replace(found, drafter=self.name, source=found.drafter, draft_s=draft_s, ahead_s=ahead_s)

    def extend_ahead(self, session: str) -> None:
        for source in self.sources:
            if hasattr(source, "extend_ahead"):
                source.extend_ahead(session)

    def ready(self, session: str, context_delta: Sequence[int] = ()) -> int:
        """Tokens its model source has drafted ahead for this context (actors/hf.py `ready`)."""
        entry = self.sessions.get(session)
        if entry is None:
            return 0
        unsent = [entry.tokens[sent:] + list(context_delta) for sent in entry.state]
        return max((source.ready(session, unsent[i]) for i, source in enumerate(self.sources) if hasattr(source, "ready")),
                   default=0)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        entry = self.sessions.extend(session, context_delta, new_state=lambda: [0] * len(self.sources))
        self.sessions.pop(session)
        for index, source in enumerate(self.sources):
            source.release(session, entry.tokens[entry.state[index] :])
