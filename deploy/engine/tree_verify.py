"""Lossless verification of several drafts at once, over their token tree (pure torch).

Greedy: from the root, follow the child whose token is the target's argmax while there is one;
emit the accepted branch plus the target's own next token: the longest draft prefix on the
target's argmax path, so output equals plain decoding.

Sampling (recursive rejection, SpecInfer / multi-draft speculative sampling): at a node, with
target distribution p, the drafts continuing from it are candidates x_1..x_c, each sampled from
its own drafter's q_i. With residual r = p: accept x_i with probability min(1, r(x_i) / q_i(x_i));
on rejection r <- norm(max(0, r - q_i)) and try the next candidate. When a candidate is accepted,
continue at its child with the drafts that pass through it; when every candidate is rejected,
emit a sample of r; at a node no draft continues from, emit a bonus sample of p. Each emitted
token is distributed exactly as p given the accepted prefix. A point-mass drafter (q = None) has
q_i = one_hot(x_i). Several candidates with the same token are tried one after the other.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from actors.proposal import SparseDist
from actors.sampling import SamplingParams, warp_probs
from deploy.engine.draft_tree import ROOT, DraftTree
from deploy.engine.verify import dense_q, draft_overlaps, residual_distribution


@dataclass(frozen=True)
class TreeVerification:
    """`token_ids` = the accepted branch's tokens + one recovered or bonus token."""

    nodes: tuple[int, ...]  # the accepted branch, from depth 1 down
    token_ids: tuple[int, ...]

    @property
    def accepted(self) -> int:
        return len(self.nodes)


def recursive_rejection(
    p: torch.Tensor, candidates: Sequence[tuple[int, torch.Tensor]], generator: torch.Generator
) -> tuple[int | None, int]:
    """One position. p: [V] target probabilities; candidates: (token, q [V] it was sampled from).

    -> (index of the accepted candidate or None, the emitted token), distributed as p.
    """
    residual = p
    for index, (token, q) in enumerate(candidates):
        if float(torch.rand((), generator=generator)) * float(q[token]) < float(residual[token]):
            return index, token
        residual = residual_distribution(residual, q)
    return None, int(torch.multinomial(residual, 1, generator=generator))


def verify_tree(
    tree: DraftTree,
    qs: Sequence[Sequence[SparseDist] | None],
    drafts: Sequence[Sequence[int]],
    target_logits: torch.Tensor,
    sampling: SamplingParams,
    generator: torch.Generator,
    p: torch.Tensor | None = None,
) -> TreeVerification:
    """target_logits: [1 + tree.size, V]: row 0 = the root (last committed token), row 1 + i = node i.
    p: `warp_probs(target_logits, sampling)` when the caller has it (computed here otherwise)."""
    node, nodes = ROOT, []
    if sampling.greedy:
        target_ids = target_logits.argmax(dim=-1).tolist()
        while True:
            wanted = target_ids[0 if node == ROOT else 1 + node]
            child = next((c for _, _, c in tree.candidates(node) if tree.tokens[c] == wanted), None)
            if child is None:
                return TreeVerification(tuple(nodes), tuple(tree.tokens[n] for n in nodes) + (wanted,))
            node = child
            nodes.append(node)
    p = warp_probs(target_logits, sampling) if p is None else p  # [1 + n, V]
    vocab = p.shape[-1]
    q_dense = [dense_q(q, draft, vocab) for q, draft in zip(qs, drafts)]  # per draft [d, V]
    while True:
        p_here = p[0 if node == ROOT else 1 + node]
        candidates = tree.candidates(node)
        if not candidates:
            bonus = int(torch.multinomial(p_here, 1, generator=generator))
            return TreeVerification(tuple(nodes), tuple(tree.tokens[n] for n in nodes) + (bonus,))
        index, token = recursive_rejection(
            p_here, [(tree.tokens[child], q_dense[d][j]) for d, j, child in candidates], generator
        )
        if index is None:
            return TreeVerification(tuple(nodes), tuple(tree.tokens[n] for n in nodes) + (token,))
        node = candidates[index][2]
        nodes.append(node)


def per_draft_outcome(
    tree: DraftTree,
    draft_index: int,
    draft: Sequence[int],
    q: Sequence[SparseDist] | None,
    p: torch.Tensor | None,
    result: TreeVerification,
) -> tuple[int, tuple[float, ...]]:
    """What one draft of the round earned: (its tokens on the accepted branch, its BD overlaps
    along its own path). p: [1 + tree.size, V] warped target probabilities, or None (no overlaps)."""
    path = tree.paths[draft_index]
    accepted = 0
    while accepted < min(len(path), result.accepted) and path[accepted] == result.nodes[accepted]:
        accepted += 1
    if p is None:
        return accepted, ()
    rows = tree.path_rows(draft_index)[: len(draft)]
    return accepted, draft_overlaps(draft, q, p[rows])
