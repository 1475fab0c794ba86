"""The `eagle` drafter: an EAGLE-3 head (actors/eagle_head.py) drafting from the target's own hidden states.

It is the one drafter that reads the target's hidden states (`needs_features = True`). Each
`propose` call carries, beside the committed tokens it has not seen, the target's features of the
committed positions it has not seen: the hidden states entering the feature layers, concatenated
([m, 3H], or such chunks in order; any float dtype).

A session holds tokens x_0..x_{n-1} and features f_0..f_{n-2]: the target has computed a feature
for every committed token but the last, whose own forward is the next verification. The session
keeps the head's keys and values of the committed pairs (fuse(f_t), x_{t+1}). Each call appends the
new pairs in one head forward, then drafts k tokens one head forward at a time, feeding the head's
output back as the next pair's feature.

A session whose features do not line up with its tokens drafts nothing: it joined a request whose
earlier features it never received.

- Greedy drafting takes the head's argmax and sends its temperature-1 distribution (top
  `q_top_n`, for the BD reward).
- Greedy drafting with k > 1 sends EAGLE-2's dynamic tree (`_tree`): the most likely nodes by the
  head's cumulative probability, as chains, each token with its probability as `confidence`.
- Sampled drafting draws from the top `q_top_n` of its warped distribution, renormalised, and sends
  exactly that q, so verification stays lossless. With k > 1 it sends `sampled_chains` chains drawn
  independently (`_sampled_chains`, SpecInfer's i.i.d. candidates): the drafts that continue from
  any tree node are independent draws from the head's q given that node, which is what the
  tree's recursive rejection needs (a repeated token, once rejected, has no residual left). They
  carry no confidence, so how many of their nodes get verified never depends on the drawn tokens'
  probabilities.
Tokens outside the head's vocabulary are never drafted.
"""
from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import torch

from actors.eagle_head import EagleHead
from actors.hf import draft_position, drafting_generator, sparse_top
from actors.proposal import Proposal, SparseDist
from actors.sampling import SamplingParams
from actors.session import SessionStore

TREE_WIDTH = 4  # EAGLE-2's top-k: nodes expanded per depth, children proposed per node
TREE_NODES = 24  # the most nodes a tree sends
SAMPLED_CHAINS = 2  # independent chains a sampled request's draft holds


@dataclass
class _EagleState:
    keys: torch.Tensor  # [1, kv_heads, paired, d]: the committed pairs'
    values: torch.Tensor
    features: list[torch.Tensor] = field(default_factory=list)  # chunks of f_t received and not yet paired, [m, 3H]
    received: int = 0  # features received
    paired: int = 0  # committed pairs in keys/values
    last: torch.Tensor | None = None  # the head's output at the last committed pair [H]
    generator: torch.Generator | None = None


@dataclass
class _Node:
    token: int
    parent: int  # index among the tree's nodes; -1: a child of the last committed token
    log_p: float  # the head's log-probability of the path to it
    prob: float  # the head's probability of it given its parent
    dist: SparseDist  # the distribution it was read from (its parent's)
    h: torch.Tensor | None = None  # the head's output at its pair, once computed


def _chains(nodes: Sequence[_Node], kept: set[int]) -> list[list[int]]:
    """The kept subtree as root-to-leaf paths: first the one taking the most likely child at every node."""
    children: dict[int, list[int]] = {}
    for i in sorted(kept, key=lambda i: -nodes[i].log_p):
        children.setdefault(nodes[i].parent, []).append(i)
    paths: list[list[int]] = []

    def walk(node: int, path: list[int]) -> None:
        below = children.get(node, [])
        if not below and path:
            paths.append(path)
        for child in below:
            walk(child, path + [child])

    walk(-1, [])
    return paths


def causal_allowed(past: int, n: int) -> torch.Tensor:
    """n new positions after `past` cached ones, each seeing the past, the new ones before it and itself: [1, n, past + n]."""
    return torch.ones(n, past + n, dtype=torch.bool).tril(past)[None]


class EagleProposer:
    model_free = False
    needs_features = True

    def __init__(self, head: EagleHead, name: str = "eagle", q_top_n: int = 64, tree_width: int = TREE_WIDTH,
                 tree_nodes: int = TREE_NODES, sampled_chains: int = SAMPLED_CHAINS) -> None:
        """tree_width: candidates kept per depth (0: greedy requests draft a chain too); tree_nodes: the most
        nodes a tree sends (the engine verifies the ones worth it); sampled_chains: independent chains of a
        sampled draft (1: a chain)."""
        self.name, self.head, self.q_top_n = name, head, q_top_n
        self.tree_width, self.tree_nodes, self.sampled_chains = tree_width, tree_nodes, sampled_chains
        self.device = head.fc.weight.device
        self.sessions = SessionStore()

    def _new_state(self) -> _EagleState:
        empty = self.head.empty_kv()
        return _EagleState(keys=empty, values=empty)

    def _catch_up(self, state: _EagleState, tokens: Sequence[int]) -> bool:
        """Put every committed pair into the head's keys and values. -> False when the features do not line up."""
        if state.received != len(tokens) - 1 or not tokens or state.received == 0:
            return False
        if state.paired < state.received:  # the chunks held are exactly the features not paired yet
            pending = torch.cat(state.features).to(self.device)  # [m, 3H]
            new = len(pending)
            ids = torch.tensor([list(tokens[state.paired + 1 : state.received + 1])], device=self.device)
            positions = torch.arange(state.paired, state.received, device=self.device)[None]
            out, state.keys, state.values = self.head.step(ids, self.head.fused(pending)[None], positions, state.keys,
                                                           state.values, causal_allowed(state.paired, new).to(self.device))
            state.last, state.features, state.paired = out[0, -1], [], state.received
        return state.last is not None

    @torch.inference_mode()
    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams,
                features: torch.Tensor | Sequence[torch.Tensor] | None = None) -> Proposal:
        start = time.perf_counter()
        entry = self.sessions.extend(session, context_delta, new_state=self._new_state)
        state = entry.state
        for chunk in ([features] if isinstance(features, torch.Tensor) else features or ()):
            if len(chunk):
                state.features.append(chunk)
                state.received += len(chunk)
        if k <= 0 or not self._catch_up(state, entry.tokens):
            return Proposal(drafter=self.name, draft_s=time.perf_counter() - start)
        if sampling.greedy and self.tree_width > 1 and k > 1:
            return self._tree(state, k, start)
        if state.generator is None and not sampling.greedy:
            state.generator = drafting_generator(sampling, self.name)
        if not sampling.greedy and self.sampled_chains > 1 and k > 1:
            return self._sampled_chains(state, k, sampling, start)
        h, keys, values = state.last, state.keys, state.values
        vocabulary = self.head.head_ids.cpu()
        draft: list[int] = []
        q: list[SparseDist] = []
        for j in range(k):
            logits = self.head.logits(h).float().cpu()  # [V']
            token, dist, _ = draft_position(logits, sampling, state.generator, self.q_top_n, vocabulary)
            draft.append(token)
            q.append(dist)
            if j < k - 1:  # the drafted pair (h, token) at the next position, on the committed pairs and the chain so far
                ids = torch.tensor([[token]], device=self.device)
                positions = torch.tensor([[state.paired + j]], device=self.device)
                allowed = torch.ones(1, 1, keys.shape[2] + 1, dtype=torch.bool, device=self.device)
                out, keys, values = self.head.step(ids, h[None, None], positions, keys, values, allowed)
                h = out[0, -1]
        return Proposal(self.name, tuple(draft), tuple(q), time.perf_counter() - start)

    def _tree(self, state: _EagleState, depth: int, start: float) -> Proposal:
        """EAGLE-2's dynamic tree, greedy: at each depth the `tree_width` most likely nodes (by the
        product of the head's probabilities along their path) each propose their `tree_width` most
        likely children, computed in one head forward; then the `tree_nodes` most likely nodes of all
        (a parent is at least as likely as its child, so they form a subtree) are sent as chains: the
        most likely child at each node first, then the other root-to-leaf paths."""
        head, width = self.head, self.tree_width
        vocabulary = head.head_ids.cpu()
        nodes: list[_Node] = []

        def expand(parents: Sequence[int], h: torch.Tensor) -> None:
            """Each parent's `width` most likely children, all rows' logits in one matmul: h [rows, H]."""
            log_p = torch.log_softmax(head.logits(h).float().cpu(), dim=-1)  # [rows, V']
            top = torch.topk(log_p, width, dim=-1)
            for row, parent in enumerate(parents):
                ids, probs = sparse_top(log_p[row].exp(), self.q_top_n)
                dist = SparseDist(tuple(vocabulary[ids].tolist()), tuple(probs.tolist()))  # the temperature-1 q, for BD
                base = 0.0 if parent < 0 else nodes[parent].log_p
                for index, child_log_p in zip(top.indices[row].tolist(), top.values[row].tolist()):
                    nodes.append(_Node(int(vocabulary[index]), parent, base + child_log_p, math.exp(child_log_p), dist))

        expand([-1], state.last[None])
        frontier = list(range(len(nodes)))
        keys, values = state.keys, state.values
        computed: list[int] = []  # nodes whose pairs are in keys/values beyond the committed ones, in order
        for d in range(1, depth):
            frontier = sorted(frontier, key=lambda i: -nodes[i].log_p)[:width]
            ids = torch.tensor([[nodes[i].token for i in frontier]], device=self.device)
            g = torch.stack([state.last if nodes[i].parent < 0 else nodes[nodes[i].parent].h for i in frontier])[None]
            positions = torch.full((1, len(frontier)), state.paired + d - 1, device=self.device)
            allowed = torch.zeros(1, len(frontier), keys.shape[2] + len(frontier), dtype=torch.bool)
            allowed[0, :, : state.paired] = True
            for row, i in enumerate(frontier):
                allowed[0, row, keys.shape[2] + row] = True
                ancestor = nodes[i].parent
                while ancestor >= 0:
                    allowed[0, row, state.paired + computed.index(ancestor)] = True
                    ancestor = nodes[ancestor].parent
            out, keys, values = head.step(ids, g, positions, keys, values, allowed.to(self.device))
            computed += frontier
            first_child = len(nodes)
            for row, i in enumerate(frontier):
                nodes[i].h = out[0, row]
            expand(frontier, out[0])
            frontier = list(range(first_child, len(nodes)))
        kept = sorted(range(len(nodes)), key=lambda i: -nodes[i].log_p)[: self.tree_nodes]
        chains = _chains(nodes, set(kept))
        draft_s = time.perf_counter() - start
        proposals = [Proposal(self.name, tuple(nodes[i].token for i in path), tuple(nodes[i].dist for i in path), draft_s,
                              confidence=tuple(nodes[i].prob for i in path)) for path in chains]
        return replace(proposals[0], branches=tuple(replace(p, draft_s=0.0) for p in proposals[1:]))

    def _sampled_chains(self, state: _EagleState, depth: int, sampling: SamplingParams, start: float) -> Proposal:
        """`sampled_chains` chains of `depth` tokens, each token a fresh draw from the head's q given its own
        chain, all chains' pairs of a depth in one head forward (each attends to the committed pairs and
        its own chain)."""
        head, width = self.head, self.sampled_chains
        vocabulary = head.head_ids.cpu()

        def draw(logits: torch.Tensor) -> list[tuple[int, SparseDist]]:
            """One token per row of logits [rows, V'], each drawn from its own row's q."""
            return [draft_position(row, sampling, state.generator, self.q_top_n, vocabulary)[:2] for row in logits]

        chains = [[token] for token in draw(head.logits(state.last).float().cpu()[None].expand(width, -1))]
        keys, values = state.keys, state.values
        h = state.last[None].expand(width, -1)  # [W, H]: each chain's output that drew its last token
        for d in range(1, depth):
            past = keys.shape[2]
            ids = torch.tensor([[chain[-1][0] for chain in chains]], device=self.device)
            positions = torch.full((1, width), state.paired + d - 1, device=self.device)
            allowed = torch.zeros(1, width, past + width, dtype=torch.bool)
            allowed[0, :, : state.paired] = True
            for row in range(width):  # its own earlier pairs (depth j's at paired + j * width + row), then itself
                allowed[0, row, state.paired + row : past : width] = True
                allowed[0, row, past + row] = True
            out, keys, values = head.step(ids, h[None], positions, keys, values, allowed.to(self.device))
            h = out[0]
            for chain, token in zip(chains, draw(head.logits(h).float().cpu())):  # all rows' logits in one matmul
                chain.append(token)
        proposals = [Proposal(self.name, tuple(t for t, _ in chain), tuple(q for _, q in chain), 0.0) for chain in chains]
        return replace(proposals[0], draft_s=time.perf_counter() - start, branches=tuple(proposals[1:]))

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
