"""Replicas pool their draft-length statistics through the coordinator: a new replica starts from
what the others learned, nothing observed while a share travels is lost or counted twice, a
failed share is sent again, and the pool survives the coordinator's checkpoint (no Ray needed)."""
import json
from concurrent.futures import Future

import numpy as np
import pytest

from actors.proposal import Proposal
from deploy.engine.draft_length import DraftLengths
from deploy.engine.shared_lengths import LengthSharing
from policy.coordinator import Coordinator
from policy.pooled_counts import PooledCounts


def lengths() -> DraftLengths:
    return DraftLengths(lambda n: 0.04 * n, lambda n: n, 8)


def draft(drafter: str = "ngram") -> Proposal:
    return Proposal(drafter, tuple(range(10, 16)), match_length=2)


def coordinator() -> Coordinator:
    from actors.ngram import NgramProposer

    return Coordinator({"ngram": NgramProposer()}, policy="metasd-ucb")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_new_replica_starts_from_what_another_replica_learned():
    shared = coordinator()
    first, second = lengths(), lengths()
    sharing = LengthSharing(first, shared.pool_lengths)
    for _ in range(20):
        first.observe(draft(), accepted=1)  # the first token accepted, the second rejected
    assert sharing.share_now()
    assert LengthSharing(second, shared.pool_lengths).share_now()
    assert second.acceptance(draft(), 2) == pytest.approx(first.acceptance(draft(), 2))
    assert second.acceptance(draft(), 2)[1] < 0.2  # the second position learned to fail, never seen here


def test_two_replicas_draft_on_both_replicas_evidence_counted_once():
    shared = coordinator()
    a, b = lengths(), lengths()
    sharing_a, sharing_b = LengthSharing(a, shared.pool_lengths), LengthSharing(b, shared.pool_lengths)
    a.observe(draft(), accepted=6)
    b.observe(draft(), accepted=0)
    sharing_a.share_now(), sharing_b.share_now(), sharing_a.share_now(), sharing_b.share_now()
    for engine in (a, b):
        reached, accepted = engine.counts()[("ngram", "", 2)]
        assert reached[:2].tolist() == [2, 1] and accepted[:2].tolist() == [1, 1]


def test_what_a_replica_observes_while_its_share_travels_is_neither_lost_nor_doubled():
    shared, mine = coordinator(), lengths()
    answers: list[Future] = []

    def pool_later(delta):
        answers.append(Future())
        answers[-1].delta = delta
        return answers[-1]

    clock = Clock()
    sharing = LengthSharing(mine, pool_later, every_s=5.0, clock=clock)
    mine.observe(draft(), accepted=2)
    sharing.maybe_share()  # sent; the answer has not come
    mine.observe(draft(), accepted=2)  # observed while it travels
    answers[0].set_result(shared.pool_lengths(answers[0].delta))
    sharing.maybe_share()  # takes the answer; not due to send again
    assert len(answers) == 1
    reached, _ = mine.counts()[("ngram", "", 2)]
    assert reached[0] == 2  # the pool's one plus the one since
    clock.now = 5.0
    sharing.maybe_share()
    answers[1].set_result(shared.pool_lengths(answers[1].delta))
    sharing.maybe_share()
    assert shared.draft_lengths.snapshot()[json.dumps(["ngram", "", 2])][0][0] == 2  # each counted once
    assert mine.counts()[("ngram", "", 2)][0][0] == 2


def test_a_failed_share_is_sent_again_with_the_next():
    shared, mine = coordinator(), lengths()
    failing = [True]

    def pool(delta):
        answer = Future()
        if failing[0]:
            answer.set_exception(RuntimeError("the coordinator is restarting"))
        else:
            answer.set_result(shared.pool_lengths(delta))
        return answer

    sharing = LengthSharing(mine, pool, every_s=0.0)
    mine.observe(draft(), accepted=3)
    assert not sharing.share_now()
    failing[0] = False
    mine.observe(draft(), accepted=3)
    assert sharing.share_now()
    assert shared.draft_lengths.snapshot()[json.dumps(["ngram", "", 2])][0][0] == 2
    assert mine.counts()[("ngram", "", 2)][0][0] == 2


def test_the_pooled_statistics_survive_the_coordinators_checkpoint():
    first = coordinator()
    mine = lengths()
    mine.observe(draft(), accepted=4)
    LengthSharing(mine, first.pool_lengths).share_now()
    restarted = coordinator()
    assert restarted.restore(json.loads(json.dumps(first.learned())))  # as the actor stores it
    newcomer = lengths()
    LengthSharing(newcomer, restarted.pool_lengths).share_now()
    assert np.array_equal(newcomer.counts()[("ngram", "", 2)][0], mine.counts()[("ngram", "", 2)][0])


def test_a_confidence_drafters_calibration_is_pooled_too():
    shared, a, b = coordinator(), lengths(), lengths()
    confident = Proposal("eagle", (1, 2), confidence=(0.95, 0.95))
    for _ in range(10):
        a.observe(confident, accepted=0)
    LengthSharing(a, shared.pool_lengths).share_now()
    LengthSharing(b, shared.pool_lengths).share_now()
    assert b.acceptance(confident, 1) == pytest.approx(a.acceptance(confident, 1))
    assert b.acceptance(confident, 1)[0] < 0.5


def test_pooled_rows_of_different_lengths_add_position_by_position():
    pool = PooledCounts()
    pool.add({"k": [[1, 1], [1]]})
    assert pool.add({"k": [[1, 1, 1], [0, 1]]}) == {"k": [[2, 2, 1], [1, 1]]}
    short = lengths()
    short.set_counts({("ngram", "", 2): (np.ones(3), np.ones(3))})  # from a replica drafting 3 tokens
    assert len(short.acceptance(draft(), 6)) == 6  # padded to this engine's 8 positions


def test_a_replica_seeds_its_draft_guard_from_the_peer_with_the_most_evidence():
    from deploy.engine.draft_guard import PROBES, DraftGuard

    shared = coordinator()
    veteran, newcomer = DraftGuard(), DraftGuard()
    for drafted in [False] * PROBES + [True] * (PROBES + 5):
        veteran.observe(8, drafted, 1.4 if drafted else 1.0)
    LengthSharing(lengths(), shared.pool_lengths, guard=veteran, pool_guard=shared.pool_guard).share_now()
    LengthSharing(lengths(), shared.pool_lengths, guard=newcomer, pool_guard=shared.pool_guard).share_now()
    assert newcomer.pays(8) is True  # no plain probes to run first
    assert shared.pool_guard(newcomer.state()) == shared.pool_guard(veteran.state())  # the veteran's figures kept
