"""The coordinator actor's body runs without Ray for what does not need it: a drafter marked down
can still be taken out of the pool; a batch iteration's rounds ask each drafter once; lookup
drafters given as specs draft inside it and are added and removed there; a dead replica's
published metrics go once it has been silent long enough."""
import asyncio
from types import SimpleNamespace

import pytest

from cluster import coordinator_actor as coordinator_module
from cluster.coordinator_actor import CoordinatorActor
from policy.coordinator import DraftCall
from tests.policy.test_coordinator import GREEDY, RecordingProposer


def test_a_drafter_that_is_down_can_still_be_removed_from_the_pool(monkeypatch):
    monkeypatch.setattr(coordinator_module, "named_drafters", dict)  # no Ray: the given pool
    a, b = RecordingProposer("a"), RecordingProposer("b")

    async def mark_down_then_remove():
        actor = CoordinatorActor({"a": a, "b": b}, policy="metasd-ucb")
        actor._mark_down("b", b, hung=False)  # as after a failed round
        down = (await actor.stats())["down"]
        removed = await actor.remove_drafter("b", drain_s=0)
        with pytest.raises(KeyError):
            await actor.remove_drafter("b", drain_s=0)
        return down, removed, (await actor.stats())["down"], list(await actor.drafter_handles())

    down, removed, down_after, pool_after = asyncio.run(mark_down_then_remove())
    assert down == ["b"] and removed is b
    assert down_after == [] and pool_after == ["a"]


class FakeDrafterHandle:
    """A drafter actor's handle without Ray: `propose_batch.remote` answers at once (or fails)."""

    def __init__(self, proposer, fails: bool = False) -> None:
        self.proposer, self.fails, self.batches = proposer, fails, []
        self.propose_batch = self  # handle.propose_batch.remote(...)

    def remote(self, calls):
        from ray.exceptions import RayError

        self.batches.append([call[0] for call in calls])
        answer = asyncio.get_running_loop().create_future()
        if self.fails:
            answer.set_exception(RayError("the actor died"))
        else:
            answer.set_result([self.proposer.propose(*call) for call in calls])
        return answer


def test_one_batched_call_asks_each_drafter_once_for_all_its_requests(monkeypatch):
    monkeypatch.setattr(coordinator_module, "named_drafters", dict)
    good, broken = FakeDrafterHandle(RecordingProposer("a")), FakeDrafterHandle(RecordingProposer("b"), fails=True)
    calls = [DraftCall(f"r{i}", [1, 2, i], None, 3, GREEDY) for i in range(3)]

    async def batch(policy, drafters):
        return await CoordinatorActor(drafters, policy=policy).propose_batch(calls)

    rounds = asyncio.run(batch("fixed:a", {"a": good}))
    assert good.batches == [["r0", "r1", "r2"]]  # one call for the three requests
    assert [r.proposals[0].token_ids for r in rounds] == [(0, 0, 0), (1, 1, 1), (2, 2, 2)]
    rounds = asyncio.run(batch("fixed:b", {"b": broken}))
    assert broken.batches == [["r0", "r1", "r2"]]
    assert all(r.proposals[0].drafter == "b" and not r.proposals[0].token_ids for r in rounds)  # plain steps


class FakeFeatureHandle(FakeDrafterHandle):
    """A feature drafter's actor handle: says so when asked (`kind`), and records each call's tuple."""

    def __init__(self, proposer) -> None:
        super().__init__(proposer)
        self.kind, self.calls = self, []

    def remote(self, calls=None):
        if calls is None:  # handle.kind.remote()
            answer = asyncio.get_running_loop().create_future()
            answer.set_result({"model_free": False, "needs_features": True})
            return answer
        self.calls += calls
        return super().remote(calls)


def test_the_actor_learns_which_drafters_read_features_and_sends_them_only_those(monkeypatch):
    from tests.policy.test_coordinator import FeatureRecorder

    monkeypatch.setattr(coordinator_module, "named_drafters", dict)
    eagle, lookup = FakeFeatureHandle(FeatureRecorder("eagle")), FakeDrafterHandle(RecordingProposer("lookup"))

    async def rounds(policy):
        actor = CoordinatorActor({"eagle": eagle, "lookup": lookup}, policy=policy)
        stats = await actor.ready()
        answered = await actor.propose_batch([DraftCall("r", [1, 2, 3], None, 2, GREEDY, features=[0.5, 0.6])])
        return stats, answered

    stats, (draft_round,) = asyncio.run(rounds("fixed:eagle"))
    assert stats["features"] is True and draft_round.features_wanted
    assert eagle.calls[0][4] == ([0.5, 0.6],) and eagle.proposer.features["r"] == [0.5, 0.6]
    asyncio.run(rounds("fixed:lookup"))
    assert lookup.batches and lookup.proposer.seen["r"] == [1, 2, 3]  # asked with four arguments, as before


def test_lookup_drafters_draft_inside_the_actor_and_are_added_and_removed_there(monkeypatch):
    from cluster.drafter_actor import DrafterSpec

    monkeypatch.setattr(coordinator_module, "named_drafters", dict)
    model = FakeDrafterHandle(RecordingProposer("model"))
    model.release = SimpleNamespace(remote=lambda request_id, delta: None)  # the actor's release, fire and forget
    repeat = [5, 6, 7, 5, 6, 7, 5, 6]  # the n-gram drafter continues the repetition

    async def serve_a_request():
        actor = CoordinatorActor({"ngram": DrafterSpec("ngram", "ngram"), "model": model}, policy="fixed:ngram")
        (draft_round,) = await actor.propose_batch([DraftCall("r", repeat, None, 3, GREEDY)])
        open_during = (await actor.hosted_drafters())["ngram"]["open_sessions"]
        await actor.finish("r", [7])
        hosted_after = await actor.hosted_drafters()
        await actor.add_drafter("suffix", DrafterSpec("suffix", "suffix"), {"name": "suffix", "kind": "suffix"})
        handles = await actor.drafter_handles()
        removed = await actor.remove_drafter("suffix", drain_s=0)
        return draft_round, open_during, hosted_after, handles, removed, await actor.drafter_handles()

    draft_round, open_during, hosted_after, handles, removed, handles_after = asyncio.run(serve_a_request())
    assert draft_round.proposals[0].drafter == "ngram" and draft_round.proposals[0].token_ids[:2] == (7, 5)
    assert model.batches == []  # fixed:ngram asked no actor
    assert open_during == 1 and hosted_after == {"ngram": {"kind": "ngram", "model": None, "open_sessions": 0}}
    assert handles == {"ngram": None, "model": model, "suffix": None}  # None: hosted by the coordinator
    assert removed is None and handles_after == {"ngram": None, "model": model}


def test_a_dead_replicas_metrics_go_when_the_live_ones_publish_even_if_nobody_scrapes(monkeypatch):
    monkeypatch.setattr(coordinator_module, "named_drafters", dict)
    clock = [1000.0]
    monkeypatch.setattr(coordinator_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    async def replicas_publishing():
        actor = CoordinatorActor({"a": RecordingProposer("a")}, policy="metasd-ucb")
        await actor.put_metrics("dead", ["families of dead"])
        clock[0] += coordinator_module.METRICS_STALE_S + 1  # it was killed: silent since
        await actor.put_metrics("live", ["families of live"])
        return sorted(actor.replica_families)

    assert asyncio.run(replicas_publishing()) == ["live"]
