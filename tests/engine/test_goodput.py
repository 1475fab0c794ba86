"""Goodput control (deploy/engine/goodput.py): a batch verifies the draft nodes most likely accepted,
across requests, as many as raise the batch's expected tokens per second; when positions are
nearly free every draft is verified, when each costs what a plain step does none is."""
from deploy.engine.goodput import batch_draft_nodes

PROBABILITIES = [[0.9, 0.5], [0.8, 0.1]]  # two requests' draft nodes, most likely first


def test_the_most_likely_nodes_of_the_whole_batch_are_verified_first():
    # base: 2 rows, 2 expected tokens; cost 2 + n: 0.9 and 0.8 raise the rate (0.58, 0.62), 0.5 lowers it (0.60)
    assert batch_draft_nodes(PROBABILITIES, 2, 2.0, lambda n: 2 + n) == [1, 1]


def test_a_cheaper_position_lets_longer_drafts_pay():
    # cost 10 + n: 0.9, 0.8 and 0.5 pay (rate 0.28), the 0.1 node does not (0.27)
    assert batch_draft_nodes(PROBABILITIES, 2, 2.0, lambda n: 10 + n) == [2, 1]
    assert batch_draft_nodes(PROBABILITIES, 2, 2.0, lambda n: 1000 + n) == [2, 2]


def test_when_a_position_costs_what_a_plain_step_does_no_draft_pays():
    assert batch_draft_nodes(PROBABILITIES, 2, 2.0, lambda n: float(n)) == [0, 0]


def test_a_request_without_draft_nodes_gets_none():
    assert batch_draft_nodes([[], [0.99]], 2, 2.0, lambda n: 10 + n) == [0, 1]
