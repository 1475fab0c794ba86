"""The coordinator sends each drafter exactly the committed tokens it has not seen, learns from
feedback riding on the next call, and frees every session on finish (no Ray needed)."""
import time
from collections.abc import Sequence

import pytest

from actors.proposal import Proposal
from actors.sampling import SamplingParams
from policy.coordinator import Coordinator, Feedback, RoundFeedback

GREEDY = SamplingParams()


def verdict(drafter: str, drafted: int, accepted: int, reward: float) -> RoundFeedback:
    return RoundFeedback((Feedback(drafter, drafted, accepted, reward),))


class RecordingProposer:
    """Keeps what it was sent; drafts the last token it saw, repeated."""

    def __init__(self, name: str, model_free: bool = False) -> None:
        self.name = name
        self.model_free = model_free
        self.seen: dict[str, list[int]] = {}
        self.released: dict[str, list[int]] = {}

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        tokens = self.seen.setdefault(session, [])
        tokens.extend(context_delta)
        return Proposal(self.name, tuple(tokens[-1:] * k))

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.released[session] = self.seen.pop(session, []) + list(context_delta)


def test_each_drafter_catches_up_on_exactly_the_tokens_it_missed():
    a, b = RecordingProposer("a"), RecordingProposer("b")
    coordinator = Coordinator({"a": a, "b": b}, policy="random", seed=3)
    committed, feedback, chosen = [1, 2, 3], None, set()
    new = list(committed)
    for step in range(12):
        (proposal,) = coordinator.propose("r", new, feedback, 2, GREEDY).proposals
        chosen.add(proposal.drafter)
        drafter = {"a": a, "b": b}[proposal.drafter]
        assert drafter.seen["r"] == committed  # caught up, nothing more, nothing less
        new = [100 + step]
        committed = committed + new
        feedback = verdict(proposal.drafter, 2, 0, 0.5)
    assert chosen == {"a", "b"}
    coordinator.finish("r", new, feedback)  # the last round's tokens arrive with finish
    assert a.released["r"] == committed and b.released["r"] == committed
    assert coordinator.stats()["active_requests"] == 0


def test_feedback_updates_the_request_bandit_and_the_drafter_statistics():
    a = RecordingProposer("a")
    coordinator = Coordinator({"a": a}, policy="metasd-ucb")
    coordinator.propose("r", [1, 2], None, 3, GREEDY)
    coordinator.propose("r", [5], verdict("a", 3, 2, 0.8), 3, GREEDY)
    stats = coordinator.stats()["drafters"]["a"]
    assert stats == {"pulls": 1, "drafted": 3, "accepted": 2, "acceptance": pytest.approx(2 / 3), "mean_reward": 0.8,
                     "counterfactual": 0}
    assert coordinator.requests["r"].bandit.stats["a"].pulls == 1
    assert coordinator.global_stats["a"].mean == pytest.approx(0.8)


def test_a_coordinator_restored_from_a_checkpoint_starts_where_the_last_one_left_off():
    import json

    first = Coordinator({"a": RecordingProposer("a"), "b": RecordingProposer("b")}, policy="metasd-ucb-warm")
    first.propose("r", [1, 2], None, 3, GREEDY)
    first.propose("r", [5], verdict("a", 3, 2, 0.8), 3, GREEDY)
    checkpoint = json.loads(json.dumps(first.learned()))  # as the actor stores it
    restarted = Coordinator({"a": RecordingProposer("a"), "c": RecordingProposer("c")}, policy="metasd-ucb-warm")
    assert restarted.restore(checkpoint)
    assert restarted.stats()["drafters"]["a"] == first.stats()["drafters"]["a"]
    assert "b" not in restarted.stats()["drafters"]  # a drafter no longer in the pool is not brought back
    assert restarted.global_stats["a"].mean == pytest.approx(0.8)  # what a warm bandit starts from
    other = Coordinator({"a": RecordingProposer("a")}, policy="metasd-ucb-cost-warm")  # another reward
    assert not other.restore(checkpoint) and other.global_stats["a"].pulls == 0


def test_no_room_to_draft_means_a_plain_step_without_asking_any_drafter():
    a = RecordingProposer("a")
    coordinator = Coordinator({"a": a}, policy="fixed:a")
    draft_round = coordinator.propose("r", [1, 2], None, 0, GREEDY)
    assert draft_round.proposals == () and draft_round.label == "none" and "r" not in a.seen


def test_finishing_an_unknown_request_is_harmless():
    Coordinator({"a": RecordingProposer("a")}, policy="fixed:a").finish("never-seen", [1])


def test_a_drafter_added_live_is_explored_by_the_request_in_flight_after_catching_up():
    a, late = RecordingProposer("a"), RecordingProposer("late")
    coordinator = Coordinator({"a": a}, policy="metasd-ucb", seed=0)
    committed = [1, 2, 3]
    (proposal,) = coordinator.propose("r", committed, None, 2, GREEDY).proposals
    coordinator.add_drafter("late", late)
    # UCB tries an untried arm first: the next round of the same request goes to the new drafter
    (proposal,) = coordinator.propose("r", [7], verdict(proposal.drafter, 2, 0, 0.1), 2, GREEDY).proposals
    assert proposal.drafter == "late"
    assert late.seen["r"] == committed + [7]  # the whole context, caught up at once
    assert "late" in coordinator.stats()["drafters"] and "late" in coordinator.spec.arms


def test_adding_a_drafter_whose_name_is_taken_is_refused():
    coordinator = Coordinator({"a": RecordingProposer("a")}, policy="metasd-ucb")
    with pytest.raises(ValueError, match="already in the pool"):
        coordinator.add_drafter("a", RecordingProposer("a"))


def test_every_drafter_of_a_round_learns_from_its_own_feedback():
    pool = {"a": RecordingProposer("a"), "b": RecordingProposer("b", model_free=True)}
    coordinator = Coordinator(pool, policy="metasd-ucb", verify="tree")
    coordinator.propose("r", [1, 2], None, 3, GREEDY)
    both = RoundFeedback((Feedback("a", 3, 3, 0.9), Feedback("b", 3, 0, 0.1)))
    coordinator.propose("r", [5], both, 3, GREEDY)
    bandit = coordinator.requests["r"].bandit
    assert bandit.stats["a"].mean == pytest.approx(0.9) and bandit.stats["b"].mean == pytest.approx(0.1)
    assert coordinator.stats()["drafters"]["b"]["accepted"] == 0


def test_a_round_drafts_with_one_chosen_drafter_and_shadows_only_when_the_mode_verifies_more():
    pool = {"model": RecordingProposer("model"), "free": RecordingProposer("free", model_free=True),
            "other": RecordingProposer("other", model_free=True)}
    for verify in ("chosen", "counterfactual", "tree"):
        coordinator = Coordinator(pool, policy="metasd-ucb", verify=verify)
        for step in range(6):
            draft_round = coordinator.propose(verify, [1, 2] if step == 0 else [step], None, 2, GREEDY)
            (chosen,) = [p.drafter for p in draft_round.proposals]
            expected = [] if verify == "chosen" else sorted(n for n in ("free", "other") if n != chosen)
            assert sorted(p.drafter for p in draft_round.shadows) == expected
            assert draft_round.verify == verify and draft_round.tree == (verify == "tree")
        coordinator.finish(verify)


def test_counterfactual_drafts_come_from_unchosen_model_free_drafters_and_teach_only_the_bandit():
    pool = {"model": RecordingProposer("model"), "free": RecordingProposer("free", model_free=True)}
    ucb = Coordinator(pool, policy="metasd-ucb", seed=0, verify="counterfactual")
    draft_round = ucb.propose("s", [1, 2, 3], None, 2, GREEDY)
    (chosen,) = draft_round.proposals
    if chosen.drafter == "free":  # a model-free drafter that is chosen drafts for real: no shadow
        assert draft_round.shadows == ()
        draft_round = ucb.propose("s", [4], RoundFeedback((Feedback("free", 2, 0, 0.0),)), 2, GREEDY)
        (chosen,) = draft_round.proposals
    (shadow,) = draft_round.shadows
    assert (chosen.drafter, shadow.drafter) == ("model", "free")
    assert shadow.token_ids == (ucb.requests["s"].tokens[-1],) * 2  # caught up like any drafter
    ucb.propose("s", [4], RoundFeedback((Feedback(chosen.drafter, 2, 0, 0.2),
                                         Feedback(shadow.drafter, 2, 1, 0.6, counterfactual=True))), 2, GREEDY)
    bandit = ucb.requests["s"].bandit
    assert bandit.stats[shadow.drafter].pulls == 1 and bandit.stats[shadow.drafter].mean == pytest.approx(0.6)
    assert ucb.stats()["drafters"][shadow.drafter]["pulls"] == 0


def test_a_request_whose_target_stopped_calling_is_forgotten_after_the_ttl():
    a = RecordingProposer("a")
    coordinator = Coordinator({"a": a}, policy="metasd-ucb", request_ttl_s=0.05)
    coordinator.propose("dead", [1, 2], None, 2, GREEDY)
    assert coordinator.expire() == {}  # still fresh
    time.sleep(0.1)
    coordinator.propose("alive", [3], None, 2, GREEDY)
    assert coordinator.expire() == {"dead": {"a": []}}  # the caller releases these sessions
    assert list(coordinator.requests) == ["alive"]


def test_a_deferred_model_drafter_told_to_sit_out_drafts_nothing_and_later_catches_up_on_what_it_missed():
    lookup, model = RecordingProposer("lookup", model_free=True), RecordingProposer("model")
    coordinator = Coordinator({"lookup": lookup, "model": model}, policy="metasd-ucb", verify="tree")
    committed, new, feedback, deferred = [1, 2, 3], [1, 2, 3], None, 0
    for step in range(6):  # UCB keeps choosing the model arm: sitting out teaches it nothing
        draft_round = coordinator.propose("r", new, feedback, 3, GREEDY, defer_models=True)
        feedback = None
        if draft_round.deferred:
            # the cheap draft is in hand before the model drafter is sized; the coordinator never calls back
            assert draft_round.deferred == ("model",) and draft_round.proposals == ()
            assert [p.drafter for p in draft_round.shadows] == ["lookup"]
            assert coordinator.draft_deferred("r", {"model": 0}, GREEDY) == ()
            deferred += 1
        else:
            feedback = RoundFeedback((Feedback("lookup", 3, 0, 0.0),))
        new = [100 + step]
        committed = committed + new
    assert deferred >= 4 and "r" not in model.seen
    draft_round = coordinator.propose("r", new, None, 3, GREEDY, defer_models=True)
    assert draft_round.deferred == ("model",)
    (proposal,) = coordinator.draft_deferred("r", {"model": 2}, GREEDY)
    assert proposal.drafter == "model" and proposal.token_ids == (committed[-1],) * 2  # asked for 2 of k = 3
    assert model.seen["r"] == committed  # caught up on every token it sat out


def test_without_deferral_a_model_drafter_drafts_k_tokens_in_the_same_call():
    lookup, model = RecordingProposer("lookup", model_free=True), RecordingProposer("model")
    coordinator = Coordinator({"lookup": lookup, "model": model}, policy="fixed:model", verify="counterfactual")
    draft_round = coordinator.propose("r", [1, 2, 3], None, 3, GREEDY)
    assert draft_round.deferred == () and [p.drafter for p in draft_round.proposals] == ["model"]
    assert draft_round.proposals[0].token_ids == (3, 3, 3)


class FeatureRecorder(RecordingProposer):
    """A drafter that reads the target's features: keeps them beside its tokens."""

    needs_features = True

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.features: dict[str, list[float]] = {}

    def propose(self, session, context_delta, k, sampling, features=None):
        self.features.setdefault(session, []).extend(x for chunk in features or () for x in chunk)
        return super().propose(session, context_delta, k, sampling)


def test_a_feature_drafter_catches_up_on_exactly_the_features_it_missed_and_others_never_get_any():
    eagle, lookup = FeatureRecorder("eagle"), RecordingProposer("lookup")  # lookup's propose takes no features
    coordinator = Coordinator({"eagle": eagle, "lookup": lookup}, policy="random", seed=5)
    assert coordinator.wants_features and coordinator.stats()["features"] is True
    committed, features = [1, 2, 3], [10.0, 20.0]  # one feature per committed token but the last
    new, new_features, chosen = list(committed), list(features), set()
    for step in range(12):
        draft_round = coordinator.propose("r", new, None, 2, GREEDY, features=new_features)
        assert draft_round.features_wanted
        (proposal,) = draft_round.proposals
        chosen.add(proposal.drafter)
        if proposal.drafter == "eagle":
            assert eagle.seen["r"] == committed and eagle.features["r"] == features
        new, new_features = [100 + step, 200 + step], [30.0 + step, 40.0 + step]
        committed, features = committed + new, features + new_features
    assert chosen == {"eagle", "lookup"}


def test_a_deferred_feature_drafter_that_sits_out_gets_its_features_later():
    lookup, eagle = RecordingProposer("lookup", model_free=True), FeatureRecorder("eagle")
    coordinator = Coordinator({"lookup": lookup, "eagle": eagle}, policy="fixed:eagle", verify="counterfactual")
    coordinator.propose("r", [1, 2, 3], None, 3, GREEDY, defer_models=True, features=[0.1, 0.2])
    assert coordinator.draft_deferred("r", {"eagle": 0}, GREEDY) == ()  # sat out: nothing sent
    coordinator.propose("r", [4], None, 3, GREEDY, defer_models=True, features=[0.3])
    (proposal,) = coordinator.draft_deferred("r", {"eagle": 2}, GREEDY)
    assert eagle.seen["r"] == [1, 2, 3, 4] and eagle.features["r"] == [0.1, 0.2, 0.3]


def test_a_pool_without_a_feature_drafter_keeps_no_features_and_asks_for_none():
    coordinator = Coordinator({"lookup": RecordingProposer("lookup")}, policy="fixed:lookup")
    draft_round = coordinator.propose("r", [1, 2, 3], None, 2, GREEDY, features=[0.1, 0.2])
    assert not draft_round.features_wanted and coordinator.requests["r"].features == []


def test_a_contextual_coordinator_starts_a_request_on_the_arm_that_paid_on_similar_prompts():
    import json

    import numpy as np

    rng = np.random.default_rng(0)
    width = 16
    prompt = {task: 4.0 + np.eye(width)[task] * 3 for task in (0, 1)}

    def served(coordinator: Coordinator, task: int, name: str) -> str:
        """One request of `task`: arm a pays on task 0, arm b on task 1. -> its first chosen arm."""
        context = prompt[task] + rng.normal(scale=0.2, size=width)
        (proposal,) = coordinator.propose(name, [1, 2], None, 3, GREEDY, context=context).proposals
        paid = {"a": 0.9 if task == 0 else 0.1, "b": 0.1 if task == 0 else 0.9}
        coordinator.finish(name, [3], RoundFeedback(tuple(Feedback(arm, 3, 2, reward, counterfactual=arm != proposal.drafter)
                                                         for arm, reward in paid.items())))
        return proposal.drafter

    coordinator = Coordinator({"a": RecordingProposer("a"), "b": RecordingProposer("b")}, policy="metasd-ucb-context")
    for i in range(6):
        served(coordinator, i % 2, f"warmup-{i}")
    assert [served(coordinator, task, f"r{task}") for task in (0, 1, 0, 1)] == ["a", "b", "a", "b"]
    restarted = Coordinator({"a": RecordingProposer("a"), "b": RecordingProposer("b")}, policy="metasd-ucb-context")
    assert restarted.restore(json.loads(json.dumps(coordinator.learned())))
    assert [served(restarted, task, f"s{task}") for task in (1, 0)] == ["b", "a"]
    plain_warm = Coordinator({"a": RecordingProposer("a"), "b": RecordingProposer("b")}, policy="metasd-ucb-warm")
    for i in range(6):
        served(plain_warm, i % 2, f"warmup-{i}")
    assert len(plain_warm.contexts) == 0  # only a contextual policy keeps the prompts
