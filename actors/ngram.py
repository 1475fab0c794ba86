"""Prompt lookup (n-gram) drafter: continue the request's own context where its tail occurred before.

For n from max_n down to min_n, find earlier occurrences of the last n context tokens; take the
most recent one that is followed by a full k tokens (else the one with the longest continuation)
and propose what followed it. Model-free, so q is a point mass. Matching is vectorised with numpy.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from actors.proposal import Proposal
from actors.session import SessionStore
from deploy.errors import InvalidRequestError
from deploy.sampling import SamplingParams


def lookup_continuation(context: np.ndarray, n: int, k: int) -> np.ndarray:
    """context: [L] int. The up-to-k tokens that followed the latest earlier occurrence of context[-n:]."""
    length = context.shape[0]
    if length <= n or k <= 0:
        return context[:0]
    windows = sliding_window_view(context[:-1], n)  # starts 0 .. L-1-n, so a continuation exists
    starts = np.flatnonzero((windows == context[-n:]).all(axis=1))
    if starts.size == 0:
        return context[:0]
    full = starts[starts + n + k <= length]
    start = int(full[-1]) if full.size else int(starts[0])
    return context[start + n : start + n + k]


def longest_lookup(context: np.ndarray, min_n: int, max_n: int, k: int) -> tuple[int, ...]:
    """The continuation of the longest tail (max_n down to min_n tokens) that occurred earlier; () if none."""
    for n in range(max_n, min_n - 1, -1):
        found = lookup_continuation(context, n, k)
        if found.size:
            return tuple(int(t) for t in found)
    return ()


class NgramProposer:
    model_free = True  # cheap enough to ask every round for counterfactual feedback

    def __init__(self, name: str = "ngram", min_n: int = 2, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise InvalidRequestError("ngram.min_n", f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.name, self.min_n, self.max_n = name, min_n, max_n
        self.sessions = SessionStore()

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        context = np.asarray(self.sessions.extend(session, context_delta).tokens, dtype=np.int64)
        draft = longest_lookup(context, self.min_n, self.max_n, k)
        return Proposal(drafter=self.name, token_ids=draft, draft_s=time.perf_counter() - start)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
