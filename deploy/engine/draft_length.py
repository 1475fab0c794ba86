"""Cost-aware draft length: how many of a draft's tokens are worth a verification.

Verifying more positions costs a larger target forward; on CPU that cost is far from flat (here a
forward over 2 positions costs what 1 does, 4 about 1.3 plain steps, 8 about 1.3-1.5). A drafter's late
tokens are worth verifying only while their expected yield pays for the larger forward.

`DraftLengths` learns, per (drafter, source, match length) — which of a composite drafter's sources
drafted (a hierarchy's level, a retrieval drafter's datastore or the request's context) and the
length of context it matched, its evidence (actors/proposal.py; 0 when a drafter does not say) —
how often draft position i was reached (every earlier drafted token accepted) and accepted, over
every verified draft. A draft that states its confidence per token (the eagle head's probability
of each token given its parent) is rated by calibration instead: per drafter, how often its
tokens of each confidence decile were accepted when reached, with the confidence as the prior;
a draft that also states each token's rank among its source's candidates (the recycling drafter's
tree) is calibrated per (drafter, depth, rank, confidence decile).
A draft of n tokens is cut to the length l in 0..n with the most expected tokens per second:

    a_i = (accepted_i + PRIOR * WEIGHT) / (reached_i + WEIGHT)
    E[emitted | l] = 1 + sum_{i=1..l} prod_{j<=i} a_j
    l* = argmax_l E[emitted | l] / cost(l + 1)       (cost(1): a plain step)

then lengthened to fill the forward it needs anyway (a size padded up to a cheaper one verifies
the draft's next tokens instead of throwaway positions). Cutting is lossless: a draft's prefix,
with its q, is a draft. `rate` is the same estimate for a draft as it stands (E[emitted | n] per
second of its forward): the engine compares a round's drafts by it; `select_tree` chooses the
nodes of several drafts' token tree worth verifying: of each size, the nodes most likely accepted
(the `tree` verification mode). `tokens_to_draft` is the same choice
made before drafting, for a drafter that pays `per_token_s` of drafting per token (a model): the
length l in 1..k with the most expected tokens per second of drafting plus verification, or 0 when
that rate does not beat the best draft already in hand; `best_reach` bounds every draft's P(accepted)
by position before any is drafted (a batch's draft budget). The statistics are shared by
every request of the engine; concurrent updates may rarely lose one count, which only slows the
learning.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np

from actors.proposal import Proposal
from deploy.engine.draft_tree import ROOT, DraftTree

PRIOR = 0.6  # acceptance assumed for a position never reached yet (optimistic enough to try it)
WEIGHT = 2.0  # pseudo-counts behind PRIOR
MAX_MATCH_KEY = 8  # longer matches share one row of statistics
CONFIDENCE, CONFIDENCE_BINS = "confidence", 10  # a drafter's stated confidences, calibrated in 10 bins
DEPTH_CELLS, RANK_CELLS = 4, 4  # a draft that states ranks is calibrated per (depth, rank): 1, 2, 3, 4+ x 0, 1, 2, 3+


def _bin(confidence: float) -> int:
    return min(CONFIDENCE_BINS - 1, max(0, int(confidence * CONFIDENCE_BINS)))


def _cell(proposal: Proposal, position: int) -> int:
    """The calibration cell of a draft's position (0-based): 0 without ranks, else its (depth, rank)'s."""
    if proposal.ranks is None:
        return 0
    return 1 + min(position, DEPTH_CELLS - 1) * RANK_CELLS + min(proposal.ranks[position], RANK_CELLS - 1)


class DraftLengths:
    def __init__(self, cost_s: Callable[[int], float], forward_size: Callable[[int], int], max_k: int,
                 max_nodes: int | None = None) -> None:
        """cost_s(n): seconds of a verification forward over n positions (n = 1: a plain step);
        forward_size(n): the padded size the engine runs for n positions; max_nodes: the most draft
        nodes a round's tree may verify (None: as many as pay)."""
        self.cost_s, self.forward_size, self.max_k, self.max_nodes = cost_s, forward_size, max_k, max_nodes
        self._reached: dict[tuple[str, str, int], np.ndarray] = {}
        self._accepted: dict[tuple[str, str, int], np.ndarray] = {}

    def _rows(self, proposal: Proposal) -> tuple[np.ndarray, np.ndarray]:
        key = (proposal.drafter, proposal.source, min(proposal.match_length, MAX_MATCH_KEY))
        if key not in self._reached:
            self._reached[key], self._accepted[key] = np.zeros(self.max_k), np.zeros(self.max_k)
        return self._reached[key], self._accepted[key]

    def best_length(self, proposal: Proposal) -> int:
        """l*: the number of the draft's tokens to verify (0 = a plain step instead)."""
        n = min(len(proposal.token_ids), self.max_k)
        best, best_rate = 0, 1.0 / self.cost_s(1)
        for length, expected in enumerate(self._expected_emitted(proposal, n), start=1):
            rate = expected / self.cost_s(length + 1)
            if rate > best_rate:
                best, best_rate = length, rate
        return min(n, self.forward_size(best + 1) - 1) if best else 0

    def rate(self, proposal: Proposal) -> float:
        """Expected tokens emitted per second if this draft, as it stands, is verified (an empty
        draft: a plain step)."""
        n = min(len(proposal.token_ids), self.max_k)
        # E[emitted | l] never falls as l grows, so its largest value is E[emitted | n]
        return max(self._expected_emitted(proposal, n), default=1.0) / self.cost_s(n + 1)

    def tree_rate(self, proposals: Sequence[Proposal]) -> float:
        """Expected tokens emitted per second if these drafts are verified together as one token
        tree (deploy/engine/draft_tree.py), with each node's P(accepted) from `node_probabilities`:
        what `select_tree` maximises over the tree's cuts."""
        tree, accepted = self.node_probabilities(proposals)
        return (1.0 + sum(accepted)) / self.cost_s(tree.size + 1)

    def select_tree(self, proposals: Sequence[Proposal]) -> list[int]:
        """The nodes of these drafts' tree worth verifying, as the length each draft is cut to
        (0: left out): of every size s, the s nodes most likely accepted (a parent is never
        less likely than its child, so they form a subtree), at the size with the most expected
        tokens per second, (1 + sum of their P) / cost(s + 1); none (a plain step) when no size
        beats it. Node-level, as in EAGLE-2: a draft's first tokens can join while its tail, or a
        weaker draft, is left out."""
        tree, accepted = self.node_probabilities(proposals)
        order = sorted(range(tree.size), key=lambda node: (-accepted[node], node))[: self.max_nodes]
        best_size, best_rate, expected = 0, 1.0 / self.cost_s(1), 1.0
        for size, node in enumerate(order, start=1):
            expected += accepted[node]
            rate = expected / self.cost_s(size + 1)
            if rate > best_rate:
                best_size, best_rate = size, rate
        return self.lengths_keeping(tree, set(order[:best_size]))

    def node_probabilities(self, proposals: Sequence[Proposal]) -> tuple[DraftTree, list[float]]:
        """The drafts' token tree and each node's P(accepted). A node's acceptance, once its parent
        is accepted, is the best of its drafts' a_i there; the children of a node hold distinct
        tokens, so at most one is the target's: in draft order, child c is taken with
        prod_{earlier}(1 - a) * a_c (as if the drafts erred independently)."""
        drafts = [p.token_ids[: self.max_k] for p in proposals]
        tree = DraftTree.build(drafts)
        acceptance = [0.0] * tree.size
        for proposal, path in zip(proposals, tree.paths):
            for node, a in zip(path, self.acceptance(proposal, len(path))):
                acceptance[node] = max(acceptance[node], a)
        accepted = [0.0] * tree.size  # P(node accepted)
        missed: dict[int, float] = {}  # per parent: P(every earlier child wrong)
        for node in range(tree.size):  # a parent always precedes its children; siblings in draft order
            parent = tree.parents[node]
            reach = 1.0 if parent == ROOT else accepted[parent]
            still = missed.get(parent, 1.0)
            accepted[node] = reach * still * acceptance[node]
            missed[parent] = still * (1.0 - acceptance[node])
        return tree, accepted

    def best_reach(self, n: int) -> list[float]:
        """For i = 1..n, an upper bound on P(a draft's i-th token is accepted) before any draft
        exists: the best chain of every drafter, source and match length seen (an unseen one: the
        prior's), a confidence drafter's at its best calibrated bin. What a draft budget set before
        drafting may count on (DraftPlanner.budget)."""
        best = np.cumprod(np.full(n, PRIOR))
        for key, reached in self._reached.items():
            accepted = self._accepted[key]
            if key[1] == CONFIDENCE:
                top = float(np.max((accepted + (np.arange(CONFIDENCE_BINS) + 1) / CONFIDENCE_BINS * WEIGHT)
                                   / (reached + WEIGHT)))
                chain = top ** np.arange(1, n + 1)
            else:
                chain = np.cumprod((accepted[:n] + PRIOR * WEIGHT) / (reached[:n] + WEIGHT))
            best[: len(chain)] = np.maximum(best[: len(chain)], chain)
        return best.tolist()

    def _calibration(self, drafter: str, cell: int = 0) -> tuple[np.ndarray, np.ndarray]:
        key = (drafter, CONFIDENCE, cell)
        if key not in self._reached:
            self._reached[key], self._accepted[key] = np.zeros(CONFIDENCE_BINS), np.zeros(CONFIDENCE_BINS)
        return self._reached[key], self._accepted[key]

    def acceptance(self, proposal: Proposal, n: int) -> list[float]:
        """a_i for the draft's positions 1..n: P(accepted | reached), with the prior. A draft that
        states its confidence gets the acceptance its drafter's drafts of that confidence had
        (the confidence itself is the prior)."""
        if not n:
            return []  # an empty draft (a plain step) needs no statistics row
        if proposal.confidence is not None:
            out = []
            for i, c in enumerate(proposal.confidence[:n]):
                reached, accepted = self._calibration(proposal.drafter, _cell(proposal, i))
                out.append((float(accepted[_bin(c)]) + c * WEIGHT) / (float(reached[_bin(c)]) + WEIGHT))
            return out
        reached, accepted = self._rows(proposal)
        return [(float(accepted[i]) + PRIOR * WEIGHT) / (float(reached[i]) + WEIGHT) for i in range(n)]

    def _expected_emitted(self, proposal: Proposal, n: int) -> Iterator[float]:
        """E[emitted | l] for l = 1..n, in one pass over the positions in plain floats (a round
        asks this of every chosen and shadow draft)."""
        reach_probability, expected = 1.0, 1.0  # P(position l accepted), E[emitted | l]
        for a in self.acceptance(proposal, n):
            reach_probability *= a
            expected += reach_probability
            yield expected

    def tokens_to_draft(self, drafter: str, per_token_s: float, k: int, floor_rate: float = 0.0) -> int:
        """Tokens worth asking `drafter` for (drafts under its own name, source "", match 0):
        argmax over l in 1..k of E[emitted | l] / (cost(l + 1) + l * per_token_s), or 0 when that
        best rate is not above floor_rate (tokens per second of a draft in hand)."""
        probe = Proposal(drafter, token_ids=(0,) * min(k, self.max_k))
        best, best_rate = 0, floor_rate
        for length, expected in enumerate(self._expected_emitted(probe, len(probe.token_ids)), start=1):
            rate = expected / (self.cost_s(length + 1) + length * per_token_s)
            if rate > best_rate:
                best, best_rate = length, rate
        return best

    def counts(self) -> dict[tuple[str, str, int], tuple[np.ndarray, np.ndarray]]:
        """A copy of every statistics row: key (drafter, source, match length or calibration
        cell) -> (reached, accepted) per position or confidence bin (deploy/engine/shared_lengths.py
        pools them across replicas)."""
        return {key: (reached.copy(), self._accepted[key].copy()) for key, reached in self._reached.items()}

    def set_counts(self, counts: Mapping[tuple[str, str, int], tuple[np.ndarray, np.ndarray]]) -> None:
        """Replace every statistics row with `counts` (the form `counts()` returns); a row shorter
        than this engine's (pooled from a replica drafting fewer tokens) is padded with zeros."""
        reached_rows, accepted_rows = {}, {}
        for key, (reached, accepted) in counts.items():
            size = max(len(reached), len(accepted), CONFIDENCE_BINS if key[1] == CONFIDENCE else self.max_k)
            reached_rows[key], accepted_rows[key] = np.zeros(size), np.zeros(size)
            reached_rows[key][: len(reached)], accepted_rows[key][: len(accepted)] = reached, accepted
        self._reached, self._accepted = reached_rows, accepted_rows

    @staticmethod
    def lengths_keeping(tree: DraftTree, kept: set[int]) -> list[int]:
        """Each draft of the tree cut where its path leaves the `kept` nodes (a subtree)."""
        return [next((i for i, node in enumerate(path) if node not in kept), len(path)) for path in tree.paths]

    def cut(self, proposal: Proposal) -> Proposal:
        return proposal.cut(self.best_length(proposal))

    def observe(self, proposal: Proposal, accepted: int, skip: int = 0) -> None:
        """A verified draft (as cut) had its first `accepted` tokens accepted. skip: its first
        positions were counted already (a draft tree's chain sharing them with an earlier one)."""
        drafted = min(len(proposal.token_ids), self.max_k)
        if not drafted:
            return
        if proposal.confidence is not None:
            for i in range(skip, min(accepted + 1, drafted)):
                c = proposal.confidence[i]
                reached, accepted_counts = self._calibration(proposal.drafter, _cell(proposal, i))
                reached[_bin(c)] += 1
                accepted_counts[_bin(c)] += i < accepted
            return
        reached, accepted_counts = self._rows(proposal)
        reached[skip : min(accepted + 1, drafted)] += 1
        accepted_counts[skip : min(accepted, drafted)] += 1
