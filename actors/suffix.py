"""Suffix-cache drafter (SuffixDecoding-style) over previous requests' prompts and outputs.

`SuffixTrie` stores every suffix, cut at `max_depth` tokens, of each cached sequence, with counts.
To draft, match the longest tail of the current context (max_match .. min_match tokens) as a path
from the root, then follow the most frequent child up to k times. Finished requests are inserted
on `release`; the cache is bounded by `max_cached_tokens` and evicts the oldest sequences first
(their counts are decremented and empty nodes dropped). Model-free, so q is a point mass.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from actors.errors import InvalidRequestError
from actors.proposal import Proposal
from actors.sampling import SamplingParams
from actors.session import SessionStore


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    def __init__(self, max_depth: int = 32, max_cached_tokens: int = 200_000) -> None:
        self.max_depth = max_depth
        self.max_cached_tokens = max_cached_tokens
        self.root = _Node()
        self._sequences: deque[tuple[int, ...]] = deque()
        self.cached_tokens = 0

    def __len__(self) -> int:
        return len(self._sequences)

    def insert(self, sequence: Sequence[int]) -> None:
        seq = tuple(int(t) for t in sequence)[-self.max_cached_tokens :]
        if not seq:
            return
        for i in range(len(seq)):
            node = self.root
            for token in seq[i : i + self.max_depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                child.count += 1
                node = child
        self._sequences.append(seq)
        self.cached_tokens += len(seq)
        while self.cached_tokens > self.max_cached_tokens:
            self._remove(self._sequences.popleft())

    def _remove(self, seq: tuple[int, ...]) -> None:
        self.cached_tokens -= len(seq)
        for i in range(len(seq)):
            node = self.root
            for token in seq[i : i + self.max_depth]:
                child = node.children[token]
                child.count -= 1
                if child.count == 0:
                    del node.children[token]
                    break
                node = child

    def continuation(self, context: Sequence[int], k: int, min_match: int, max_match: int) -> tuple[int, ...]:
        """Most frequent continuation (<= k tokens) after the longest matching tail of context."""
        longest = min(max_match, len(context), self.max_depth - 1)
        for m in range(longest, min_match - 1, -1):
            node: _Node | None = self.root
            for token in context[len(context) - m :]:
                node = node.children.get(token)
                if node is None:
                    break
            if node is None or not node.children:
                continue
            draft: list[int] = []
            while node.children and len(draft) < k:
                token, node = max(node.children.items(), key=lambda item: item[1].count)
                draft.append(token)
            return tuple(draft)
        return ()


class SuffixProposer:
    model_free = True

    def __init__(
        self,
        name: str = "suffix",
        min_match: int = 3,
        max_match: int = 16,
        max_depth: int = 32,
        max_cached_tokens: int = 200_000,
    ) -> None:
        if not 1 <= min_match <= max_match:
            raise InvalidRequestError("suffix.min_match", f"need 1 <= min_match <= max_match, got {min_match}, {max_match}")
        self.name, self.min_match, self.max_match = name, min_match, max_match
        self.trie = SuffixTrie(max_depth=max_depth, max_cached_tokens=max_cached_tokens)
        self.sessions = SessionStore()

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        tokens = self.sessions.extend(session, context_delta).tokens
        draft = self.trie.continuation(tokens, k, self.min_match, self.max_match)
        return Proposal(drafter=self.name, token_ids=draft, draft_s=time.perf_counter() - start)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        entry = self.sessions.extend(session, context_delta)
        self.sessions.pop(session)
        self.trie.insert(entry.tokens)
