"""The coordinator actor's body runs without Ray for what does not need it: a drafter marked down
can still be taken out of the pool."""
import asyncio

import pytest

from cluster import coordinator_actor as coordinator_module
from cluster.coordinator_actor import CoordinatorActor
from tests.policy.test_coordinator import RecordingProposer


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
