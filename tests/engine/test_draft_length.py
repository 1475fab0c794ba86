"""The draft-length rule verifies as much of a draft as its expected yield pays for, and learns it."""
from dataclasses import replace

import pytest

from actors.proposal import Proposal, SparseDist
from deploy.engine.draft_length import DraftLengths

PLAIN_S = 0.040


def flat_cost(n: int) -> float:
    return PLAIN_S  # a GPU-like forward: any size costs one plain step


def steep_cost(n: int) -> float:
    return PLAIN_S * n  # every verified position costs a plain step


def unpadded(n: int) -> int:
    return n


def draft(drafter: str = "ngram", match_length: int = 2, length: int = 6) -> Proposal:
    return Proposal(drafter, tuple(range(10, 10 + length)), match_length=match_length)


def test_a_flat_forward_cost_verifies_the_whole_draft():
    assert DraftLengths(flat_cost, unpadded, 8).best_length(draft()) == 6


def test_when_each_position_costs_a_plain_step_no_draft_is_worth_verifying():
    assert DraftLengths(steep_cost, unpadded, 8).best_length(draft()) == 0


def test_a_drafter_whose_first_token_is_always_rejected_stops_being_verified():
    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.2 * (n - 1)), unpadded, 8)
    assert lengths.best_length(draft()) > 0
    for _ in range(50):
        lengths.observe(lengths.cut(draft()), accepted=0)
    assert lengths.best_length(draft()) == 0
    assert lengths.best_length(draft(match_length=4)) > 0  # other evidence keeps its own statistics


def test_a_drafter_that_is_always_right_gets_its_whole_draft_verified():
    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.2 * (n - 1)), unpadded, 8)
    for _ in range(50):
        lengths.observe(draft(), accepted=6)
    assert lengths.best_length(draft()) == 6


def test_the_cut_fills_the_padded_forward_it_needs_anyway():
    lengths = DraftLengths(flat_cost, lambda n: 8 if n > 4 else n, 8)
    assert lengths.best_length(draft(length=7)) == 7  # 5 positions are padded to 8: the draft's 7 tokens fit


def test_the_rate_of_a_draft_ranks_drafters_by_what_they_have_yielded_at_that_match_length():
    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.2 * (n - 1)), unpadded, 8)
    for _ in range(20):
        lengths.observe(draft("good"), accepted=6)
        lengths.observe(draft("bad"), accepted=0)
    assert lengths.rate(draft("good")) > 1 / PLAIN_S > lengths.rate(draft("bad"))
    assert lengths.rate(Proposal("none")) == 1 / PLAIN_S  # an empty draft is a plain step
    assert lengths.rate(draft("bad", match_length=5)) > lengths.rate(draft("bad"))  # unseen evidence keeps the prior


def test_each_source_of_a_composite_drafter_keeps_its_own_statistics():
    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.2 * (n - 1)), unpadded, 8)
    datastore = replace(draft("retrieval-math"), source="datastore")
    context = replace(draft("retrieval-math"), source="context")
    for _ in range(20):
        lengths.observe(datastore, accepted=6)
        lengths.observe(context, accepted=0)
    assert lengths.best_length(datastore) == 6 and lengths.best_length(context) == 0


def test_a_cut_draft_keeps_its_q_for_the_kept_tokens():
    q = tuple(SparseDist((t,), (1.0,)) for t in (5, 6, 7))
    cut = Proposal("hf", (5, 6, 7), q, 0.01).cut(2)
    assert cut.token_ids == (5, 6) and cut.q == q[:2] and cut.drafter == "hf"


def test_a_model_drafter_is_asked_for_fewer_tokens_the_longer_each_takes_to_draft():
    lengths = DraftLengths(flat_cost, unpadded, 8)
    for accepted in [2, 4, 6, 8] * 10:  # each later token less likely accepted
        lengths.observe(Proposal("distill", tuple(range(8))), accepted=accepted)
    cheap = lengths.tokens_to_draft("distill", per_token_s=0.0, k=8)
    costly = lengths.tokens_to_draft("distill", per_token_s=0.2 * PLAIN_S, k=8)
    assert cheap == 8 and 1 <= costly < cheap
    assert lengths.tokens_to_draft("distill", per_token_s=0.0, k=3) == 3  # never more than the round's k


def test_a_model_drafter_sits_the_round_out_when_a_draft_in_hand_promises_more():
    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.05 * (n - 1)), unpadded, 8)
    for _ in range(20):
        lengths.observe(Proposal("distill", tuple(range(8))), accepted=1)
        lengths.observe(draft("retrieval"), accepted=6)
    in_hand = lengths.rate(draft("retrieval"))
    assert lengths.tokens_to_draft("distill", per_token_s=0.1 * PLAIN_S, k=8) > 0  # nothing in hand: it drafts
    assert lengths.tokens_to_draft("distill", per_token_s=0.1 * PLAIN_S, k=8, floor_rate=in_hand) == 0


def test_a_model_drafter_rarely_right_is_asked_for_nothing_when_a_plain_step_promises_more():
    from types import SimpleNamespace

    from deploy.engine.planner import DraftPlanner

    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.05 * (n - 1)), unpadded, 8)
    for _ in range(40):
        lengths.observe(Proposal("weak", tuple(range(8))), accepted=0)  # its first token is almost never right
    planner = DraftPlanner(8, SimpleNamespace(), lengths)
    planner.draft_s_per_token["weak"] = 0.1 * PLAIN_S
    assert planner._model_tokens("weak", in_hand=()) == 0
    for _ in range(40):
        lengths.observe(Proposal("fair", tuple(range(8))), accepted=4)  # right for its first four tokens
    planner.draft_s_per_token["fair"] = 0.1 * PLAIN_S
    assert planner._model_tokens("fair", in_hand=()) > 0


def test_a_tree_of_one_draft_or_of_equal_drafts_promises_what_the_draft_alone_does():
    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.2 * (n - 1)), unpadded, 8)
    for _ in range(10):
        lengths.observe(draft(), accepted=3)
    assert lengths.tree_rate([draft()]) == pytest.approx(lengths.rate(draft()))
    assert lengths.tree_rate([draft(), draft()]) == pytest.approx(lengths.rate(draft()))


def test_a_second_draft_that_diverges_adds_its_chance_only_where_the_first_is_wrong():
    first = Proposal("half", (1, 2, 3))
    second = Proposal("other", (1, 5, 6))  # shares the first token, then diverges
    wrong = Proposal("wrong", (7, 8, 9))
    flat, steep = DraftLengths(flat_cost, unpadded, 8), DraftLengths(steep_cost, unpadded, 8)
    for lengths in (flat, steep):
        for _ in range(200):
            lengths.observe(first, accepted=1)  # a_1 ~ 1, a_2 ~ 0
            lengths.observe(second, accepted=3)  # always right
            lengths.observe(wrong, accepted=0)
    alone = flat.rate(first) * PLAIN_S  # tokens a forward: ~2
    together = flat.tree_rate([first, second]) * PLAIN_S
    # the shared token is accepted, then 'other' continues where 'half' fails: ~1 + 1 + 2
    assert alone == pytest.approx(2.0, abs=0.05) and together == pytest.approx(4.0, abs=0.1)
    # a draft that is always wrong adds nothing: free on a flat-cost device, a loss where positions cost
    assert flat.tree_rate([first, wrong]) == pytest.approx(flat.rate(first), rel=0.01)
    assert steep.tree_rate([first, wrong]) < steep.rate(first) < steep.tree_rate([first, second])


def test_a_tree_cut_node_by_node_keeps_a_drafts_likely_head_and_leaves_out_what_does_not_pay():
    first = Proposal("half", (1, 2, 3))  # its first token right, its second never
    second = Proposal("other", (1, 5, 6))  # shares the first token, then always right
    wrong = Proposal("wrong", (7, 8, 9))
    mild = DraftLengths(lambda n: PLAIN_S * (1 + 0.05 * (n - 1)), unpadded, 8)
    flat, steep = DraftLengths(flat_cost, unpadded, 8), DraftLengths(steep_cost, unpadded, 8)
    for lengths in (mild, flat, steep):
        for _ in range(200):
            lengths.observe(first, accepted=1)
            lengths.observe(second, accepted=3)
            lengths.observe(wrong, accepted=0)
    # where each position costs a little: the shared token and 'other', not 'half''s tail nor 'wrong'
    assert mild.select_tree([first, second, wrong]) == [1, 3, 0]
    # free positions: every node may be right, so all are verified; a plain step where each costs a step
    assert flat.select_tree([first, second, wrong]) == [3, 3, 3]
    assert steep.select_tree([first, second, wrong]) == [0, 0, 0]
    # the cut tree promises more than the best whole-draft set does
    best_set = max(mild.tree_rate(s) for s in ([first], [first, second], [first, second, wrong]))
    assert mild.tree_rate([first.cut(1), second]) > best_set


def test_the_best_reach_before_drafting_bounds_every_drafts_chain_of_acceptance():
    lengths = DraftLengths(lambda n: PLAIN_S * (1 + 0.2 * (n - 1)), unpadded, 8)
    for _ in range(20):
        lengths.observe(draft(match_length=4), accepted=6)  # a long match: nearly always right
        lengths.observe(draft(match_length=1), accepted=0)  # a short one: always wrong
    reach = lengths.best_reach(6)
    for proposal in (draft(match_length=4), draft(match_length=1), draft("suffix")):
        _, chain = lengths.node_probabilities([proposal])
        assert all(p <= bound + 1e-12 for p, bound in zip(chain, reach))
    assert reach[5] > 0.6 ** 6  # the long match's evidence raised the bound above the prior's
