"""Replicas on like hardware share one forward-cost profile through the coordinator: the first to
ask measures and publishes it, the others wait for it and adopt it without timing a forward; a
peer that died measuring, or no coordinator, leaves a replica to measure for itself; unlike
hardware never shares (no Ray needed)."""
import torch

from deploy.engine.cost_model import BATCH_SIZES, TREE_SIZES, BatchCosts, ForwardCosts, max_positions
from deploy.engine.defaults import K, MAX_PADDING
from deploy.engine.shared_profile import ProfileBoard, adopt_shared_profile, profile_key
from deploy.engine.target import TargetModel

POSITIONS = max_positions(K, MAX_PADDING)


def peer_profile() -> dict:
    """A profile as a peer publishes it, its seconds made up (a target that times anything differs)."""
    trees = [n for n in TREE_SIZES if n > POSITIONS]
    return {"forward": [0.01 + 0.001 * n for n in range(1, POSITIONS + 1)],
            "batch": [{"sizes": trees, "rows": 1, "context": 128, "seconds": [0.05 + 0.001 * n for n in trees]},
                      {"sizes": list(BATCH_SIZES), "rows": 32, "context": 64,
                       "seconds": [0.02 + 0.002 * n for n in BATCH_SIZES]}]}


def untimed(target: TargetModel) -> TargetModel:
    """A target of its own over the same model, that fails if it runs a forward."""
    fresh = TargetModel(target.loaded)

    def no_forward(*args, **kwargs):
        raise AssertionError("the adopted profile should leave nothing to time")

    fresh.forward_batch = no_forward
    return fresh


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_replica_that_adopts_a_peers_profile_prices_forwards_without_timing_one(target):
    fresh = untimed(target)
    board = ProfileBoard()
    board.put(profile_key(fresh), peer_profile())

    assert adopt_shared_profile(fresh, lambda key, who: board.ask(key, who, 0.0), "replica-b")
    costs, batch = ForwardCosts(fresh, POSITIONS, MAX_PADDING), BatchCosts(fresh)
    assert costs.verify_s_by_size[1:] == peer_profile()["forward"]
    assert batch.seconds == peer_profile()["batch"][1]["seconds"]
    assert fresh.cost_profile() == peer_profile()


def test_the_first_replica_measures_and_the_second_waits_for_what_it_publishes(target):
    board, clock = ProfileBoard(), Clock()
    first, second = TargetModel(target.loaded), untimed(target)
    ask = lambda key, who: board.ask(key, who, clock.now)  # noqa: E731

    assert not adopt_shared_profile(first, ask, "replica-a", clock=clock)  # nobody measured it: a measures

    def a_publishes_while_b_waits(seconds: float) -> None:
        clock.now += seconds
        if clock.now >= 5:
            board.put(profile_key(first), peer_profile())

    assert adopt_shared_profile(second, ask, "replica-b", clock=clock, sleep=a_publishes_while_b_waits)
    assert clock.now == 5  # it waited for the publication, no longer
    assert second.cost_profile() == peer_profile()


def test_a_replica_measures_itself_when_the_peer_measuring_never_publishes(target):
    board, clock = ProfileBoard(claim_s=180), Clock()
    ask = lambda key, who: board.ask(key, who, clock.now)  # noqa: E731
    key = profile_key(target)
    assert board.ask(key, "died-measuring", 0.0) == {"profile": None, "measure": True}

    def wait(seconds: float) -> None:
        clock.now += seconds

    assert not adopt_shared_profile(TargetModel(target.loaded), ask, "replica-b", wait_s=30, clock=clock, sleep=wait)
    assert clock.now == 30
    assert board.ask(key, "replica-c", 100.0)["measure"] is False  # the claim still stands
    assert board.ask(key, "replica-c", 181.0)["measure"] is True  # abandoned: the next to ask measures


def test_a_replica_measures_itself_when_the_coordinator_does_not_answer(target):
    def unreachable(key, who):
        raise TimeoutError("coordinator restarting")

    assert not adopt_shared_profile(TargetModel(target.loaded), unreachable, "replica-a")


def test_replicas_with_other_torch_threads_do_not_share_a_profile(target):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = profile_key(target)
        torch.set_num_threads(2)
        two = profile_key(target)
    finally:
        torch.set_num_threads(threads)
    assert one != two
    board = ProfileBoard()
    board.put(one, peer_profile())
    assert board.ask(two, "replica-b", 0.0) == {"profile": None, "measure": True}


def test_a_partial_profile_is_completed_by_measuring_only_what_it_lacks(target):
    fresh = TargetModel(target.loaded)
    profile = peer_profile()
    profile["forward"] = profile["forward"][:2]
    fresh.adopt_cost_profile(profile)
    costs = ForwardCosts(fresh, POSITIONS, MAX_PADDING)
    assert costs.verify_s_by_size[1:3] == peer_profile()["forward"][:2]  # adopted, not re-timed
    assert len(costs.verify_s_by_size) == POSITIONS + 1 and costs.verify_s_by_size[3] > 0  # the rest timed
    assert costs.tree_s == peer_profile()["batch"][0]["seconds"]
