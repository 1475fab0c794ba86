"""Goodput control for a batch iteration: how many draft tokens each request verifies, so that the
batch's expected tokens per second is the highest (SmartSpec's goodput; 0 = a plain step).

Every draft node of the batch (a chain's positions, a tree's nodes) carries its P(accepted)
(deploy/engine/draft_length.py). Verifying N more nodes costs the batch forward N more positions,
whatever request they belong to, so for each total N the best nodes to verify are the N most
likely of the whole batch; `batch_draft_nodes` takes the N with the most expected tokens per
second, (base_expected + their P) / cost_s(base_positions + N). A node is never more likely than
its parent, so each request's share of them is a prefix of its own ranking: a subtree, or a
draft's first tokens. Under light load a position costs little beside the forward's fixed cost
and long drafts pay; as the batch fills, each position costs nearly what a plain step's share
does and only near-certain tokens still pay.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence


def batch_draft_nodes(node_probabilities: Sequence[Sequence[float]], base_positions: int, base_expected: float,
                      cost_s: Callable[[int], float]) -> list[int]:
    """node_probabilities[i]: request i's draft nodes' P(accepted), most likely first.
    base_positions / base_expected: the forward's positions and expected emitted tokens before any
    of these nodes (each request's last token, and drafts verified whole). cost_s(n): seconds of
    a batch forward over n positions. -> per request, how many of its nodes to verify."""
    ranked = sorted(((p, i) for i, probabilities in enumerate(node_probabilities) for p in probabilities),
                    key=lambda pair: -pair[0])  # stable: a request's nodes keep their order
    best, best_rate, expected = 0, base_expected / cost_s(base_positions), base_expected
    for n, (p, _) in enumerate(ranked, start=1):
        expected += p
        rate = expected / cost_s(base_positions + n)
        if rate > best_rate:
            best, best_rate = n, rate
    counts = [0] * len(node_probabilities)
    for _, i in ranked[:best]:
        counts[i] += 1
    return counts
