"""The coordinator sends each drafter exactly the committed tokens it has not seen, learns from
feedback riding on the next call, and frees every session on finish (no Ray needed)."""
from collections.abc import Sequence

import pytest

from actors.proposal import Proposal
from deploy.sampling import SamplingParams
from policy.coordinator import Coordinator, Feedback

GREEDY = SamplingParams()


class RecordingProposer:
    """Keeps what it was sent; drafts the last token it saw, repeated."""

    def __init__(self, name: str) -> None:
        self.name = name
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
        proposal = coordinator.propose("r", new, feedback, 2, GREEDY)
        chosen.add(proposal.drafter)
        drafter = {"a": a, "b": b}[proposal.drafter]
        assert drafter.seen["r"] == committed  # caught up, nothing more, nothing less
        new = [100 + step]
        committed = committed + new
        feedback = Feedback(proposal.drafter, 2, 0, 0.5)
    assert chosen == {"a", "b"}
    coordinator.finish("r", new, feedback)  # the last round's tokens arrive with finish
    assert a.released["r"] == committed and b.released["r"] == committed
    assert coordinator.stats()["active_requests"] == 0


def test_feedback_updates_the_request_bandit_and_the_drafter_statistics():
    a = RecordingProposer("a")
    coordinator = Coordinator({"a": a}, policy="metasd-ucb")
    coordinator.propose("r", [1, 2], None, 3, GREEDY)
    coordinator.propose("r", [5], Feedback("a", 3, 2, 0.8), 3, GREEDY)
    stats = coordinator.stats()["drafters"]["a"]
    assert stats == {"pulls": 1, "drafted": 3, "accepted": 2, "acceptance": pytest.approx(2 / 3), "mean_reward": 0.8}
    assert coordinator.requests["r"].bandit.stats["a"].pulls == 1
    assert coordinator.global_stats["a"].mean == pytest.approx(0.8)


def test_no_room_to_draft_means_a_plain_step_without_asking_any_drafter():
    a = RecordingProposer("a")
    coordinator = Coordinator({"a": a}, policy="fixed:a")
    proposal = coordinator.propose("r", [1, 2], None, 0, GREEDY)
    assert proposal.token_ids == () and proposal.drafter == "none" and "r" not in a.seen


def test_finishing_an_unknown_request_is_harmless():
    Coordinator({"a": RecordingProposer("a")}, policy="fixed:a").finish("never-seen", [1])


def test_a_drafter_added_live_is_explored_by_the_request_in_flight_after_catching_up():
    a, late = RecordingProposer("a"), RecordingProposer("late")
    coordinator = Coordinator({"a": a}, policy="metasd-ucb", seed=0)
    committed = [1, 2, 3]
    proposal = coordinator.propose("r", committed, None, 2, GREEDY)
    coordinator.add_drafter("late", late)
    # UCB tries an untried arm first: the next round of the same request goes to the new drafter
    proposal = coordinator.propose("r", [7], Feedback(proposal.drafter, 2, 0, 0.1), 2, GREEDY)
    assert proposal.drafter == "late"
    assert late.seen["r"] == committed + [7]  # the whole context, caught up at once
    assert "late" in coordinator.stats()["drafters"] and "late" in coordinator.spec.arms


def test_adding_a_drafter_whose_name_is_taken_is_refused():
    coordinator = Coordinator({"a": RecordingProposer("a")}, policy="metasd-ucb")
    with pytest.raises(ValueError, match="already in the pool"):
        coordinator.add_drafter("a", RecordingProposer("a"))
