"""Suffix-cache drafter (SuffixDecoding-style) over previous requests' prompts and outputs.

`SuffixTrie` stores every suffix, cut at `max_depth` tokens, of each cached sequence, with counts.
To draft, match the longest tail of the current context (max_match .. min_match tokens) as a path
from the root, then follow the most frequent child up to k times. Finished requests are inserted
on `release`; the cache is bounded by `max_cached_tokens` and by `max_bytes` (its nodes, at
`BYTES_PER_NODE`, measured with tracemalloc: random token ids make up to max_depth nodes a token)
and evicts the oldest sequences first (their counts are decremented and empty nodes dropped).
Tenants are isolated: a request's `sampling.cache_salt` (the service sets it per API key) picks its
own subtree, so one tenant's history never drafts for another (no membership side channel
through acceptance); the bounds are shared. Model-free, so q is a point mass.
"""
from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

from actors.errors import InvalidRequestError
from actors.proposal import Proposal
from actors.sampling import SamplingParams
from actors.session import SessionStore

BYTES_PER_NODE = 270  # a _Node with its children dict, measured (tracemalloc, random token ids)
MAX_TRIE_BYTES = 256 << 20


class _Node:
    __slots__ = ("count", "children")

    def __init__(self) -> None:
        self.count = 0
        self.children: dict[int, _Node] = {}


class SuffixTrie:
    def __init__(self, max_depth: int = 32, max_cached_tokens: int = 200_000, max_bytes: int = MAX_TRIE_BYTES) -> None:
        self.max_depth = max_depth
        self.max_cached_tokens = max_cached_tokens
        self.max_nodes = max(1, max_bytes // BYTES_PER_NODE)
        self.roots: dict[str, _Node] = {}  # one subtree per tenant
        self._sequences: deque[tuple[str, tuple[int, ...]]] = deque()
        self.cached_tokens = 0
        self.nodes = 0

    def __len__(self) -> int:
        return len(self._sequences)

    @property
    def root(self) -> _Node:
        """The default tenant's root (requests without a cache salt)."""
        return self.roots.get("", _Node())

    def insert(self, sequence: Sequence[int], tenant: str = "") -> None:
        seq = tuple(int(t) for t in sequence)[-self.max_cached_tokens :]
        if not seq:
            return
        root = self.roots.setdefault(tenant, _Node())
        for i in range(len(seq)):
            node = root
            for token in seq[i : i + self.max_depth]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                    self.nodes += 1
                child.count += 1
                node = child
        self._sequences.append((tenant, seq))
        self.cached_tokens += len(seq)
        while self._sequences and (self.cached_tokens > self.max_cached_tokens or self.nodes > self.max_nodes):
            self._remove(*self._sequences.popleft())

    def _remove(self, tenant: str, seq: tuple[int, ...]) -> None:
        self.cached_tokens -= len(seq)
        root = self.roots[tenant]
        for i in range(len(seq)):
            node, path = root, seq[i : i + self.max_depth]
            for depth, token in enumerate(path):
                child = node.children[token]
                child.count -= 1
                if child.count == 0:  # nothing else passes here: the rest of this path goes with it
                    del node.children[token]
                    self.nodes -= len(path) - depth
                    break
                node = child
        if not root.children:
            del self.roots[tenant]

    def continuation(self, context: Sequence[int], k: int, min_match: int, max_match: int,
                     tenant: str = "") -> tuple[int, ...]:
        """Most frequent continuation (<= k tokens) after the longest matching tail of context,
        from the tenant's own cached sequences only."""
        root = self.roots.get(tenant)
        if root is None:
            return ()
        longest = min(max_match, len(context), self.max_depth - 1)
        for m in range(longest, min_match - 1, -1):
            node: _Node | None = root
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
        entry = self.sessions.extend(session, context_delta, new_state=lambda: sampling.cache_salt or "")
        draft = self.trie.continuation(entry.tokens, k, self.min_match, self.max_match, tenant=entry.state)
        return Proposal(drafter=self.name, token_ids=draft, draft_s=time.perf_counter() - start)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        entry = self.sessions.extend(session, context_delta)
        self.sessions.pop(session)
        self.trie.insert(entry.tokens, tenant=entry.state or "")
