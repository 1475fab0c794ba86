"""Goodput control (deploy/engine/goodput.py): a batch verifies the draft nodes most likely accepted,
across requests, as many as raise the batch's expected tokens per second; when positions are
nearly free every draft is verified, when each costs what a plain step does none is; before any
drafter is asked, a batch where no conceivable draft could pay gets a budget of zero; a batch
size that accepted less than its estimates verifies fewer nodes."""
from types import SimpleNamespace

from actors.proposal import Proposal
from deploy.engine.draft_length import DraftLengths
from deploy.engine.goodput import batch_draft_nodes
from deploy.engine.planner import DraftPlanner, Drafts
from policy.coordinator import DraftRound

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


def _planner(cost_s):
    planner = DraftPlanner(7, None, DraftLengths(cost_s, lambda n: n, 7))
    planner.batch_costs = SimpleNamespace(forward_s=cost_s)
    return planner


def test_before_drafting_a_batch_where_no_draft_can_pay_gets_a_budget_of_zero():
    requests = [SimpleNamespace(cutting=True)] * 8
    assert _planner(lambda n: float(n)).budget(requests) == 0  # each position costs a plain step: nothing drafted
    assert 0 < _planner(lambda n: 10.0 + n).budget(requests) <= 7  # cheap positions: some depth pays
    beside_a_prefill = _planner(lambda n: 10.0 + n).budget(requests, prefilled=500)  # there a position is nearly free
    assert beside_a_prefill > _planner(lambda n: 10.0 + n).budget(requests)
    assert _planner(lambda n: float(n)).budget([SimpleNamespace(cutting=False)] * 8) == 0  # those verify their drafts whole anyway


NGRAM_DRAFT = Proposal("ngram", token_ids=(1, 2, 3, 4))


def _batch_of(planner, n: int):
    """n requests, each with a 4-token ngram draft, and the planner's choice for them."""
    requests = [SimpleNamespace(cutting=True)] * n
    drafted = [Drafts(DraftRound(proposals=(NGRAM_DRAFT,), verify="chain"), 0.0)] * n
    return planner.choose_batch(requests, drafted)


def test_a_batch_size_that_accepted_less_than_its_estimates_verifies_fewer_nodes_and_learns_from_what_it_verified():
    planner = _planner(lambda n: 10.0 + n)
    for _ in range(20):  # the statistics: ngram's drafts accepted whole
        planner.draft_lengths.observe(NGRAM_DRAFT, 4)
    rounds, expectations = _batch_of(planner, 8)
    before = sum(len(p.token_ids) for r in rounds for p in r.proposals)
    assert before == 32 and set(expectations[0]) == {(1,), (1, 2), (1, 2, 3), (1, 2, 3, 4)}
    for _ in range(40):  # but batches of 8 accepted no node they verified
        planner.observe_batch(8, expectations, rounds, [[0]] * 8)
    rounds, _ = _batch_of(planner, 8)
    assert sum(len(p.token_ids) for r in rounds for p in r.proposals) < before
    assert planner.calibration.report()["7-8"]["accepted"] == 0.0
    rounds, _ = _batch_of(planner, 16)  # another batch size keeps its estimates
    assert sum(len(p.token_ids) for r in rounds for p in r.proposals) == 64
