"""Prompt lookup (n-gram) drafter: continue the request's own context where its tail occurred before.

For the longest n in min_n..max_n whose last n context tokens occurred before, take the most recent
earlier occurrence that is followed by a full k tokens (else the one with the longest continuation)
and propose what followed it; the proposal carries n as its match length (a one-token match is weak
evidence: the engine's draft-length rule learns how much of such a draft to verify). Model-free,
so q is a point mass. One vectorised pass over the context finds every tail length at once (the
occurrences of the last token, narrowed backwards).
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from actors.errors import InvalidRequestError
from actors.proposal import Proposal
from actors.sampling import SamplingParams
from actors.session import SessionStore


def lookup_continuation(context: np.ndarray, n: int, k: int) -> np.ndarray:
    """context: [L] int. The up-to-k tokens that followed the latest earlier occurrence of context[-n:]."""
    return _lookup(context, n, n, k)[0]


def longest_lookup(context: np.ndarray, min_n: int, max_n: int, k: int) -> tuple[int, ...]:
    """The continuation of the longest tail (max_n down to min_n tokens) that occurred earlier; () if none."""
    return matched_lookup(context, min_n, max_n, k)[0]


def matched_lookup(context: np.ndarray, min_n: int, max_n: int, k: int) -> tuple[tuple[int, ...], int]:
    """-> (longest_lookup's continuation, the length of the tail it matched; 0 if none)."""
    continuation, matched = _lookup(context, min_n, max_n, k)
    return tuple(int(t) for t in continuation), matched


def _lookup(context: np.ndarray, min_n: int, max_n: int, k: int) -> tuple[np.ndarray, int]:
    """One pass for every tail length: the earlier positions holding the last token, narrowed to
    those preceded by the tail's previous token, and so on, up to max_n tokens. Among the
    occurrences of the longest tail found (>= min_n), the most recent with k tokens after it,
    else the one with the longest continuation (the earliest)."""
    length = context.shape[0]
    if length < 2 or k <= 0:
        return context[:0], 0
    ends = np.flatnonzero(context[:-1] == context[-1])  # an occurrence's last position, each < L - 1
    found, matched = (ends, 1) if min_n <= 1 else (ends[:0], 0)
    for n in range(2, min(max_n, length - 1) + 1):
        ends = ends[ends >= n - 1]
        ends = ends[context[ends - (n - 1)] == context[length - n]]
        if ends.size == 0:
            break
        if n >= min_n:
            found, matched = ends, n
    if found.size == 0:
        return context[:0], 0
    full = found[found + 1 + k <= length]
    end = int(full[-1]) if full.size else int(found[0])
    return context[end + 1 : end + 1 + k], matched


class NgramProposer:
    model_free = True  # cheap enough to ask every round for counterfactual feedback

    def __init__(self, name: str = "ngram", min_n: int = 1, max_n: int = 4) -> None:
        if not 1 <= min_n <= max_n:
            raise InvalidRequestError("ngram.min_n", f"need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.name, self.min_n, self.max_n = name, min_n, max_n
        self.sessions = SessionStore()

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        context = np.asarray(self.sessions.extend(session, context_delta).tokens, dtype=np.int64)
        draft, matched = matched_lookup(context, self.min_n, self.max_n, k)
        return Proposal(drafter=self.name, token_ids=draft, draft_s=time.perf_counter() - start, match_length=matched)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
