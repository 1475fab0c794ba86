"""Shadow drafts (the `counterfactual` and `tree` verification modes) are scored against the output
as later rounds commit it, not cut at the round they were drafted in; the no-draft arm is scored for free; free observations do not
inflate the exploration bonus."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.proposal import Proposal
from actors.sampling import SamplingParams
from deploy.engine.cost_model import ForwardCosts, max_positions
from deploy.engine.counterfactual import CounterfactualScorer
from deploy.engine.engine import SpeculativeEngine
from policy.bandit import ArmStats
from policy.coordinator import PLAIN_ROUND, Coordinator, DraftRound
from policy.registry import PRIOR_WEIGHT, PRIOR_WEIGHT_PULLED, parse_policy
from policy.ucb import UCB
from tests.conftest import CHAT_PROMPTS

UNIFORM = torch.full((10,), 0.1)


def test_a_shadow_longer_than_its_rounds_output_is_followed_into_the_next_rounds():
    scorer = CounterfactualScorer(with_overlaps=False)
    assert scorer.add([Proposal("free", (5, 6, 7, 8))], start=100) == []
    assert scorer.observe(100, [5, 6], lambda i: UNIFORM) == []  # the chosen draft got 1 accepted + a bonus
    (final,) = scorer.observe(102, [7, 9, 1], lambda i: UNIFORM)
    assert (final.matched, final.done) == (3, True)
    assert scorer.open == []


def test_a_shadow_that_matches_entirely_is_final_as_soon_as_its_last_token_is_committed():
    scorer = CounterfactualScorer(with_overlaps=False)
    scorer.add([Proposal("free", (1, 2))], start=0)
    (final,) = scorer.observe(0, [1, 2, 3], lambda i: UNIFORM)
    assert final.matched == 2


def test_bd_terms_cover_the_matched_tokens_and_the_first_mismatch_only():
    probs = [torch.tensor([0.1, 0.6, 0.3]), torch.tensor([0.5, 0.2, 0.3]), torch.tensor([0.2, 0.2, 0.6])]
    scorer = CounterfactualScorer(with_overlaps=True)
    scorer.add([Proposal("free", (1, 2, 2))], start=10)  # matches 1, then drafts 2 where the output has 0
    (final,) = scorer.observe(10, [1, 0, 2], lambda i: probs[i])
    assert final.matched == 1
    assert final.overlaps == pytest.approx([0.6, 0.3])  # point mass: p(x) at each scored position


def test_empty_shadows_are_final_at_once_and_open_ones_at_the_end_of_the_request():
    scorer = CounterfactualScorer(with_overlaps=False)
    (empty,) = scorer.add([Proposal("free"), Proposal("other", (4, 4))], start=0)
    assert (empty.proposal.drafter, empty.matched) == ("free", 0)
    scorer.observe(0, [4], lambda i: UNIFORM)
    (last,) = scorer.finish()
    assert (last.proposal.drafter, last.matched) == ("other", 1)


class ScriptedCoordinator:
    """Verifies a wrong draft every round and shadows the target's true continuation."""

    reward_kind = "cost"

    def __init__(self, truth: list[int], vocab_size: int, verify: str = "counterfactual") -> None:
        self.truth, self.vocab_size, self.verify = truth, vocab_size, verify
        self.context = 0
        self.feedback = []

    def propose_batch(self, calls) -> list[DraftRound]:
        return [self.propose(c.new_tokens, c.feedback, c.k) for c in calls]

    def propose(self, new_tokens, feedback, k) -> DraftRound:
        self.context += len(new_tokens)
        if feedback is not None:
            self.feedback += feedback.drafts
        if k <= 0:
            return PLAIN_ROUND
        truth = tuple(self.truth[self.context : self.context + k])
        wrong = tuple((t + 1) % self.vocab_size for t in truth)
        return DraftRound((Proposal("wrong", wrong, draft_s=0.002),), (Proposal("oracle", truth, draft_s=0.003),), self.verify)

    def finish(self, request_id, new_tokens=(), feedback=None) -> None:
        if feedback is not None:
            self.feedback += feedback.drafts


def test_a_shadow_that_drafts_the_target_output_is_scored_fully_accepted_although_the_verified_draft_fails(target):
    greedy = SamplingParams(max_tokens=24)
    prompt = target.encode(messages=CHAT_PROMPTS[1])
    plain = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}").run(prompt, greedy)
    scripted = ScriptedCoordinator(prompt + plain.token_ids, target.vocab_size)
    engine = SpeculativeEngine(target, coordinator=scripted, k=4, cut_drafts=False)
    result = engine.run(prompt, greedy)
    assert result.token_ids == plain.token_ids  # every verified draft fails: one token a round
    # the shadow, never verified, taught the draft lengths as much as the verified draft did
    probe = (1, 2, 3, 4)
    rate = {name: engine.draft_lengths.rate(Proposal(name, probe)) for name in ("oracle", "never-seen", "wrong")}
    assert rate["oracle"] > rate["never-seen"] > rate["wrong"]
    oracle = [f for f in scripted.feedback if f.drafter == "oracle"]
    wrong = [f for f in scripted.feedback if f.drafter == "wrong"]
    assert all(f.counterfactual for f in oracle) and not any(f.counterfactual for f in wrong)
    assert len(oracle) == len(wrong) == sum(1 for r in result.rounds if r.drafted) > 5
    assert all(f.accepted == f.drafted for f in oracle) and sum(f.drafted for f in oracle) > len(oracle)
    assert all(f.accepted == 0 for f in wrong)
    assert np.mean([f.reward for f in oracle]) > 1.5 * np.mean([f.reward for f in wrong])
    # each cost reward counts with its round's duration in plain steps: reward x weight = tokens / (k + 1),
    # unless the rate was capped at 1 (a round priced below a plain step, as a busy machine can measure it)
    for f in scripted.feedback:
        assert f.reward * f.weight * 5 == pytest.approx(f.accepted + 1) if f.reward < 1.0 else f.weight * 5 <= f.accepted + 1 + 1e-9
    # the trace counts the shadow's drafting too: the slowest drafter, and the sum in-process drafting paid
    drafted = [r for r in result.rounds if r.drafted]
    assert all(r.drafter_s == 0.003 and r.drafting_sum_s == pytest.approx(0.005) for r in drafted)
    # drafted in parallel: the call's own overhead (its wall time beyond the drafting summed) plus the slowest drafter
    assert all(r.parallel_draft_s == pytest.approx(max(0.0, r.draft_s - 0.005) + 0.003) for r in drafted)


class FixedCosts(ForwardCosts):
    """A forward over n positions costs 1 + 0.1 (n - 1) plain steps, always: the engine's choices
    then depend on what it learned alone, not on this machine's timings."""

    def __init__(self, max_positions: int, plain_step_s: float = 0.01) -> None:
        super().__init__(None, max_positions, max_padding=0)
        self.verify_s_by_size = [0.0, *(plain_step_s * (1 + 0.1 * (n - 1)) for n in range(1, max_positions + 1))]

    def observe(self, chain_size: int, measured_s: float) -> None:
        """Fixed."""


def run_scripted(target, verify: str):
    greedy = SamplingParams(max_tokens=24)
    prompt = target.encode(messages=CHAT_PROMPTS[1])
    plain = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}").run(prompt, greedy)
    scripted = ScriptedCoordinator(prompt + plain.token_ids, target.vocab_size, verify)
    engine = SpeculativeEngine(target, coordinator=scripted, k=4, costs=FixedCosts(max_positions(4)))
    result = engine.run(prompt, greedy)
    assert result.token_ids == plain.token_ids
    return result, plain, scripted


def test_a_tree_round_verifies_the_shadow_that_promises_more_instead_of_the_chosen_draft(target):
    result, plain, scripted = run_scripted(target, "tree")
    verified = [r.drafter for r in result.rounds if r.drafted]
    # both start at the prior (a tie puts the chosen draft first); once 'wrong' has failed, the shadow
    # heads the tree, and 'wrong' soon drops out of it
    assert "wrong" in verified[0].split("+") and set(verified[-3:]) == {"oracle"} and len(verified) > 3
    assert len(result.rounds) < len(plain.token_ids) / 2
    assert any(f.drafter == "oracle" and not f.counterfactual and f.accepted > 0 for f in scripted.feedback)
    assert any(f.drafter == "wrong" and f.counterfactual for f in scripted.feedback)


def test_a_counterfactual_round_verifies_only_its_chosen_draft(target):
    result, plain, scripted = run_scripted(target, "counterfactual")
    assert {r.drafter for r in result.rounds if r.drafted} == {"wrong"}
    assert len(result.rounds) == len(plain.token_ids)  # every verified draft fails: one token a round
    assert all(f.counterfactual for f in scripted.feedback if f.drafter == "oracle")


def engine_with_three_drafts(target, tmp_path, chain: dict[str, float]):
    """An engine deciding on a GPU-like device of these chain costs, and three drafts it has learned:
    'ngram' and 'suffix' share their first token, always right, then are right half the time;
    'retrieval' is never right."""
    import json

    from deploy.bench.cost_profile import CostProfile
    from deploy.bench.device_costs import DeviceCosts

    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"device": "cuda", "plain_step_s": 0.004, "chain": chain}))
    costs = DeviceCosts(CostProfile.load(path), target, max_positions(7), model_free=["ngram", "suffix", "retrieval"])
    engine = SpeculativeEngine(target, build_drafters(["ngram", "suffix"]), verify="tree", costs=costs)
    first, second, wrong = Proposal("ngram", (1, 2, 3)), Proposal("suffix", (1, 5, 6)), Proposal("retrieval", (7, 8, 9))
    for accepted in (1, 3) * 20:
        engine.draft_lengths.observe(first, accepted)
        engine.draft_lengths.observe(second, accepted)
        engine.draft_lengths.observe(wrong, 0)
    return engine, first, second, wrong


def test_a_tree_round_verifies_the_uncut_drafts_node_by_node_and_shadows_those_left_out(target, tmp_path):
    # 6 positions cost 1.05 plain steps, 7 or more 1.3
    engine, first, second, wrong = engine_with_three_drafts(target, tmp_path, {"1": 1.0, "4": 1.0, "6": 1.05, "40": 1.3})
    uncut = DraftRound((first,), (second, wrong), verify="tree")
    picked = engine.planner.choose(uncut, cutting=True)
    # the tree of the whole drafts (5 nodes, 6 positions), not of their cuts; 'wrong' stays a shadow, as cut
    assert picked.proposals == (first, second) and picked.shadows == (engine.draft_lengths.cut(wrong),)
    # a counterfactual round verifies its chosen draft (as cut) and only scores the others
    one = engine.planner.choose(DraftRound((first,), (second, wrong), verify="counterfactual"), cutting=True)
    assert one.proposals == (engine.draft_lengths.cut(first),) and len(one.shadows) == 2


def test_the_no_draft_arm_is_a_shadow_of_cost_aware_counterfactual_policies_only():
    pool = build_drafters(["ngram", NO_DRAFT])
    cost = Coordinator(pool, "metasd-ucb-cost", verify="counterfactual")
    chosen = cost.select("r", [1, 2, 3], None, 4)
    assert sorted((chosen.arm, *chosen.shadows)) == sorted(["ngram", NO_DRAFT])
    bd = Coordinator(pool, "metasd-ucb", verify="counterfactual")
    assert bd.select("r", [1, 2, 3], None, 4).shadows == ()  # BD cannot score drafting nothing


def test_counterfactual_observations_teach_the_arm_without_counting_as_pulls():
    bandit = UCB(["model", "free"], np.random.default_rng(0))
    bandit.update("model", 0.5)
    for _ in range(50):
        bandit.update("free", 0.5, pulled=False)
    assert bandit.t == 1 and bandit.stats["free"].pulls == 50
    assert bandit.index("model") == pytest.approx(0.5 + 0.5 * math.sqrt(2 * math.log(1.0) / 1))


def test_a_counterfactual_warm_start_leans_harder_on_global_statistics_for_the_arms_it_must_pull():
    prior = {"ngram": ArmStats(100, 30.0), "distill-code": ArmStats(100, 10.0), NO_DRAFT: ArmStats(100, 12.5)}
    arms = list(prior)
    warm_cf = parse_policy("metasd-ucb-cost-warm", arms, "counterfactual").make(prior, np.random.default_rng(0), {"ngram", NO_DRAFT})
    assert {a: s.pulls for a, s in warm_cf.stats.items()} == {
        "ngram": PRIOR_WEIGHT, "distill-code": PRIOR_WEIGHT_PULLED, NO_DRAFT: PRIOR_WEIGHT}
    assert warm_cf.stats["distill-code"].mean == pytest.approx(0.1)
    warm = parse_policy("metasd-ucb-cost-warm", arms, "chosen").make(prior, np.random.default_rng(0), {"ngram", NO_DRAFT})
    assert {s.pulls for s in warm.stats.values()} == {PRIOR_WEIGHT}
    cold = parse_policy("metasd-ucb-cost", arms, "counterfactual").make(prior, np.random.default_rng(0), {"ngram", NO_DRAFT})
    assert {s.pulls for s in cold.stats.values()} == {0}
