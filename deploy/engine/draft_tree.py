"""Several drafts of one round merged into a token tree, verified by one target forward (pure).

The drafts continue the same committed context. `DraftTree.build` inserts them into a trie: equal
drafts and shared prefixes become the same nodes, so the forward pays for each distinct
(prefix, token) once. Node i has `tokens[i]`, `parents[i]` (-1 = a child of the root, the last
committed token) and `depths[i]` (1 for the root's children). `paths[d]` lists draft d's nodes.
`candidates(node)` are the drafts that continue from a node (node -1 = the root), with the token
each proposes there: at a node, multi-draft verification tries them in draft order.

The forward's positions are [root, node 0, node 1, ...]: position 1 + i is node i. Each position
attends to the committed prefix, its ancestors and itself (`attention_allowed`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

ROOT = -1


@dataclass(frozen=True)
class DraftTree:
    tokens: tuple[int, ...]
    parents: tuple[int, ...]
    depths: tuple[int, ...]
    paths: tuple[tuple[int, ...], ...]  # per draft, its nodes from depth 1 down

    @classmethod
    def build(cls, drafts: Sequence[Sequence[int]]) -> "DraftTree":
        tokens: list[int] = []
        parents: list[int] = []
        depths: list[int] = []
        children: dict[tuple[int, int], int] = {}  # (parent, token) -> node
        paths = []
        for draft in drafts:
            node, path = ROOT, []
            for depth, token in enumerate(draft, start=1):
                key = (node, int(token))
                if key not in children:
                    children[key] = len(tokens)
                    tokens.append(int(token))
                    parents.append(node)
                    depths.append(depth)
                node = children[key]
                path.append(node)
            paths.append(tuple(path))
        return cls(tuple(tokens), tuple(parents), tuple(depths), tuple(paths))

    @property
    def size(self) -> int:
        return len(self.tokens)

    def candidates(self, node: int) -> list[tuple[int, int, int]]:
        """Drafts continuing from `node`: (draft index, its position there, child node), draft order."""
        depth = 0 if node == ROOT else self.depths[node]
        out = []
        for d, path in enumerate(self.paths):
            if len(path) > depth and (depth == 0 or path[depth - 1] == node):
                out.append((d, depth, path[depth]))
        return out

    def path_rows(self, draft: int) -> list[int]:
        """Forward rows whose logits predict each of the draft's tokens, then the row after its last
        token: [root, node(x_1), ..., node(x_d)] as positions (root = 0, node i = 1 + i)."""
        return [0] + [1 + node for node in self.paths[draft]]


def attention_allowed(parents: Sequence[int], prefix_length: int) -> torch.Tensor:
    """Which keys each new position may attend to. parents: per new position, the index of its
    parent among the new positions (-1: it follows the committed prefix directly). -> bool
    [n, prefix_length + n]: the whole prefix, the ancestors and the position itself."""
    n = len(parents)
    allowed = torch.zeros(n, prefix_length + n, dtype=torch.bool)
    allowed[:, :prefix_length] = True
    for i, parent in enumerate(parents):
        allowed[i, prefix_length + i] = True
        if parent >= 0:
            allowed[i, prefix_length : prefix_length + n] |= allowed[parent, prefix_length : prefix_length + n]
    return allowed


def depths_of(parents: Sequence[int]) -> list[int]:
    """Per new position, how many positions after the prefix it sits (0 for a child of the prefix)."""
    depths: list[int] = []
    for parent in parents:
        depths.append(0 if parent < 0 else depths[parent] + 1)
    return depths
