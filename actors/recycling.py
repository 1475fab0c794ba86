"""The `recycling` drafter: a draft tree from the target's own earlier predictions (Token Recycling).

It runs no model. Its table (actors/recycling_table.py) holds, per token, the target's top-k next
tokens with their probabilities, recycled from the target's verification forwards: the engine
takes the top-k of the logits it already has at every verified position (accepted or not) and
sends them, with the positions' input tokens, on the request's next coordinator call
(`needs_predictions = True`); the coordinator hands them to `recycle` before this round drafts.
A fresh service drafts from the shipped prior (the target's predictions over a corpus) until its
tenants' overlays have rows of their own.

`propose` drafts from the last committed token a tree expanded best-first by the stored
probabilities (EAGLE-2's dynamic tree, over the table instead of a head): the root's candidates,
then always the most likely open node's candidates, up to `tree_nodes` nodes and k deep; a node's
candidates are the table's row of its (parent's token, token) pair where the tenant's overlay has
one, else of its token. Each
node states its stored probability as `confidence` and its rank among its parent's candidates
(`ranks`): the engine calibrates them per (drafter, depth, rank) against what the target accepts
(deploy/engine/draft_length.py) and cuts the tree to what pays. The tree travels as one Proposal
whose other root-to-leaf chains are `branches` (the most likely chain first).

The draft is a function of the committed context and of the table alone, never of this round's
target randomness, so under sampling it is verified as point masses (q = None) with the residual
rule (deploy/engine/tree_verify.py): lossless for any draft.
"""
from __future__ import annotations

import heapq
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from actors.proposal import Proposal
from actors.recycling_table import EMPTY, RecyclingTable
from actors.sampling import SamplingParams
from actors.session import SessionStore

RECYCLING = "recycling"  # the drafter's name and kind
TREE_NODES = 32  # the most nodes a draft tree holds (the engine verifies the ones that pay)
TREE_WIDTH = 8  # candidates of a node that may join the tree


def recycled_tree(table: RecyclingTable, tenant: str, root: int, depth: int, nodes: int,
                  width: int = TREE_WIDTH, before_root: int = EMPTY) -> tuple[list[int], list[int], list[float], list[int]]:
    """Best-first tree from `root` (preceded by `before_root`): -> (tokens, parents (-1: a child of
    the root), probabilities (each given its parent), ranks), a parent always before its children.
    A node's priority is the product of the probabilities on its path; its candidates are the
    table's row of (its parent's token, its token)."""
    tokens: list[int] = []
    parents: list[int] = []
    probs: list[float] = []
    ranks: list[int] = []
    heap: list[tuple[float, int, int, int, float, int, int]] = []  # (-path prob, order, parent, token, prob, rank, depth)
    order = 0

    def push(parent: int, token: int, previous: int, path: float, at_depth: int) -> None:
        nonlocal order
        found = table.row(tenant, token, previous)
        if found is None:
            return
        for rank, (child, p) in enumerate(zip(found[0][:width].tolist(), found[1][:width].tolist())):
            heapq.heappush(heap, (-path * p, order, parent, child, p, rank, at_depth))
            order += 1

    if depth <= 0 or nodes <= 0:
        return tokens, parents, probs, ranks
    push(-1, root, before_root, 1.0, 1)
    while heap and len(tokens) < nodes:
        negative_path, _, parent, token, p, rank, at_depth = heapq.heappop(heap)
        tokens.append(token)
        parents.append(parent)
        probs.append(p)
        ranks.append(rank)
        if at_depth < depth:
            push(len(tokens) - 1, token, root if parent < 0 else tokens[parent], -negative_path, at_depth + 1)
    return tokens, parents, probs, ranks


def tree_chains(parents: Sequence[int]) -> list[list[int]]:
    """A tree (parents before children, siblings in rank order) as root-to-leaf paths of node
    indices: first the one taking the first child at every node."""
    children: dict[int, list[int]] = {}
    for node, parent in enumerate(parents):
        children.setdefault(parent, []).append(node)
    paths: list[list[int]] = []
    stack: list[list[int]] = [[child] for child in reversed(children.get(-1, []))]
    while stack:
        path = stack.pop()
        below = children.get(path[-1], [])
        if not below:
            paths.append(path)
        stack.extend(path + [child] for child in reversed(below))
    return paths


class RecyclingProposer:
    model_free = True  # a table lookup: asked every round, scored counterfactually, drafted in the coordinator
    needs_predictions = True  # the coordinator hands it the target's top-k predictions (`recycle`)

    def __init__(self, table: RecyclingTable, name: str = RECYCLING, tree_nodes: int = TREE_NODES,
                 width: int = TREE_WIDTH) -> None:
        self.name, self.table, self.tree_nodes, self.width = name, table, tree_nodes, width
        self.sessions = SessionStore()

    def recycle(self, tenant: str | None, tokens: np.ndarray, ids: np.ndarray, probs: np.ndarray,
                previous: np.ndarray | None = None) -> None:
        """The target's predictions after `tokens` [n] (ids / probs [n, k], best first; previous [n]:
        the token before each) into the tenant's overlay."""
        if len(tokens):
            self.table.write(tenant or "", tokens, ids, probs, previous)

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        start = time.perf_counter()
        tokens = self.sessions.extend(session, context_delta).tokens
        if not tokens or k <= 0:
            return Proposal(drafter=self.name, draft_s=time.perf_counter() - start)
        ids, parents, probs, ranks = recycled_tree(self.table, sampling.cache_salt or "", tokens[-1], k,
                                                   self.tree_nodes, self.width, tokens[-2] if len(tokens) > 1 else EMPTY)
        chains = [Proposal(self.name, tuple(ids[i] for i in path), confidence=tuple(probs[i] for i in path),
                           ranks=tuple(ranks[i] for i in path)) for path in tree_chains(parents)]
        if not chains:
            return Proposal(drafter=self.name, draft_s=time.perf_counter() - start)
        return replace(chains[0], draft_s=time.perf_counter() - start, branches=tuple(chains[1:]))

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
