"""Rewards follow their formulas and stay in [0, 1]."""
import pytest

from policy.reward import block_divergence, block_efficiency, cost_reward, round_reward


def test_block_efficiency_is_accepted_over_drafted():
    assert block_efficiency(3, 4) == 0.75 and block_efficiency(0, 0) == 0.0


def test_block_divergence_averages_the_overlap_over_all_drafted_positions():
    assert block_divergence([0.9, 0.5, 0.1]) == pytest.approx(0.5)
    assert block_divergence([]) == 0.0


def test_cost_reward_compares_the_round_with_the_best_possible_round():
    # 5 drafted, all accepted, at the cost of one plain step: the best a round can do
    assert cost_reward(5, draft_s=0.0, verify_s=0.05, plain_step_s=0.05, k=5) == pytest.approx(1.0)
    # a plain step scores 1 / (k + 1)
    assert cost_reward(0, draft_s=0.0, verify_s=0.05, plain_step_s=0.05, k=5) == pytest.approx(1 / 6)
    # a rejected draft that cost more than a plain step scores below doing nothing
    assert cost_reward(0, draft_s=0.01, verify_s=0.08, plain_step_s=0.05, k=5) < 1 / 6


def test_cost_reward_is_clipped_to_one():
    assert cost_reward(5, draft_s=0.0, verify_s=0.01, plain_step_s=0.05, k=5) == 1.0


def test_round_reward_dispatches_on_the_kind_and_rejects_unknown_kinds():
    args = dict(accepted=1, drafted=2, overlaps=[0.2, 0.4], draft_s=0.0, verify_s=0.05, plain_step_s=0.05, k=5)
    assert round_reward("be", **args) == 0.5
    assert round_reward("bd", **args) == pytest.approx(0.3)
    assert round_reward("cost", **args) == pytest.approx(2 / 6)
    with pytest.raises(ValueError):
        round_reward("speed", **args)
