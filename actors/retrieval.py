"""Retrieval drafter (REST-style): continue the context from a task's datastore of token sequences.

`TokenDatastore` holds a corpus as one token array (sequences separated by -1) and its suffixes
sorted by their first `depth` tokens, stored as the sorted windows themselves ([N, depth]), so
column j of any run of suffixes sharing j leading tokens is sorted and can be binary-searched.
To draft: find the longest m in min_match..max_match whose last m context tokens start some
suffixes (a binary search over m, each probe m binary searches); take the continuations
of up to `max_candidates` of them and follow the most frequent next token, k times (a
separator ends the draft).

`RetrievalProposer` also looks the tail up in the request's own context (prompt lookup, n-grams of
`context_n`, the most local datastore, as in Hierarchy Drafting) and drafts from whichever source
matched the longer tail (the context on a tie). Model-free, so q is a point mass. A datastore is
built when its drafter loads, from its task's corpus (actors/specialists.task_datastore; seconds),
and read-only while serving.
"""
from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from actors.errors import InvalidRequestError
from actors.ngram import matched_lookup
from actors.proposal import Proposal
from actors.sampling import SamplingParams
from actors.session import SessionStore

SEPARATOR = -1


class TokenDatastore:
    def __init__(self, tokens: np.ndarray, order: np.ndarray, windows: np.ndarray) -> None:
        self.tokens = tokens  # [N] int32, SEPARATOR between sequences (and at the end)
        self.order = order  # [N] int32: suffix start positions, sorted by their first `depth` tokens
        self.windows = windows  # [N, depth] int32: tokens[order[i] : order[i] + depth], padded with SEPARATOR

    @property
    def depth(self) -> int:
        return int(self.windows.shape[1])

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @classmethod
    def build(cls, sequences: Sequence[Sequence[int]], depth: int = 16) -> TokenDatastore:
        parts = [np.append(np.asarray(seq, dtype=np.int32), SEPARATOR) for seq in sequences if len(seq)]
        if not parts:
            raise InvalidRequestError("corpus", "a datastore needs at least one non-empty sequence")
        tokens = np.concatenate(parts)
        padded = np.concatenate([tokens, np.full(depth, SEPARATOR, dtype=np.int32)])
        all_windows = np.lib.stride_tricks.sliding_window_view(padded, depth)[: tokens.shape[0]]
        order = np.lexsort(all_windows.T[::-1]).astype(np.int32)  # first column is the primary key
        return cls(tokens, order, np.ascontiguousarray(all_windows[order]))

    def match_range(self, pattern: Sequence[int]) -> tuple[int, int]:
        """[lo, hi) of the sorted suffixes that start with pattern (len(pattern) <= depth)."""
        lo, hi = 0, self.windows.shape[0]
        for j, token in enumerate(pattern):
            column = self.windows[lo:hi, j]
            lo, hi = lo + int(np.searchsorted(column, token, "left")), lo + int(np.searchsorted(column, token, "right"))
            if lo == hi:
                break
        return lo, hi

    def longest_tail(self, context: Sequence[int], min_match: int, max_match: int) -> tuple[int, int, int]:
        """(m, lo, hi): the longest tail of context, min_match..max_match tokens, that starts some
        suffix, and its match_range; (0, 0, 0) if none. A binary search over m: whenever a tail
        occurs, so does every shorter one (it starts a few positions later)."""
        best, low, high = (0, 0, 0), min_match, min(max_match, len(context), self.depth)
        while low <= high:
            m = (low + high) // 2
            lo, hi = self.match_range(context[len(context) - m :])
            if lo < hi:
                best, low = (m, lo, hi), m + 1
            else:
                high = m - 1
        return best

    def continuation(self, context: Sequence[int], k: int, min_match: int, max_match: int, max_candidates: int = 256) -> tuple[int, ...]:
        """The most frequent continuation (<= k tokens) after the longest matching tail of context."""
        return self.match(context, k, min_match, max_match, max_candidates)[0]

    def match(self, context: Sequence[int], k: int, min_match: int, max_match: int, max_candidates: int = 256) -> tuple[tuple[int, ...], int]:
        """-> (continuation, length of the matched tail); ((), 0) when no tail of min_match tokens occurs."""
        if k <= 0:
            return (), 0
        m, lo, hi = self.longest_tail(context, min_match, max_match)
        if not m:
            return (), 0
        starts = self.order[lo:hi]
        if starts.shape[0] > max_candidates:  # an even spread over the matches
            starts = starts[np.linspace(0, starts.shape[0] - 1, max_candidates).astype(np.int64)]
        offsets = starts[:, None] + m + np.arange(k)[None, :]
        follow = self.tokens[np.minimum(offsets, len(self) - 1)]  # [c, k]; the last token is a separator
        draft: list[int] = []
        for j in range(k):
            values, counts = np.unique(follow[:, j], return_counts=True)
            token = int(values[np.argmax(counts)])
            if token == SEPARATOR:
                break
            draft.append(token)
            follow = follow[follow[:, j] == token]
        return tuple(draft), m


class RetrievalProposer:
    model_free = True

    def __init__(self, datastore: TokenDatastore, name: str = "retrieval", min_match: int = 2, max_match: int = 16,
                 context_n: tuple[int, int] | None = (2, 4)) -> None:
        if not 1 <= min_match <= max_match:
            raise InvalidRequestError("retrieval.min_match", f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.name, self.datastore, self.min_match, self.max_match = name, datastore, min_match, max_match
        self.context_n = context_n  # (min n, max n) of the prompt lookup in the request's context; None: datastore only
        self.sessions = SessionStore()

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        tokens = self.sessions.extend(session, context_delta).tokens
        draft, matched = self.datastore.match(tokens, k, self.min_match, self.max_match)
        source = "datastore"
        if self.context_n is not None and matched <= self.context_n[1]:
            # a context match at least as long as the datastore's wins
            context = np.asarray(tokens, dtype=np.int64)
            in_context, n = matched_lookup(context, max(self.context_n[0], matched), self.context_n[1], k)
            if in_context:
                draft, matched, source = in_context, n, "context"
        return Proposal(drafter=self.name, token_ids=draft, draft_s=time.perf_counter() - start, match_length=matched,
                        source=source)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
