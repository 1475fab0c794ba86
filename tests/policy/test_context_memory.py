"""The context memory gives a new request the statistics of the earlier requests whose prompts
were most alike, forgets the oldest, and survives a restart as JSON."""
import json

import numpy as np
import pytest

from policy.bandit import ArmStats
from policy.context_memory import ContextMemory

WIDTH = 32


def prompt_like(task: int, rng: np.random.Generator) -> np.ndarray:
    """A context near one of two task directions (and a shared offset every prompt has)."""
    directions = np.eye(WIDTH)[:2] * 3.0
    return 5.0 + directions[task] + rng.normal(scale=0.3, size=WIDTH)


def taught(memory: ContextMemory, rng: np.random.Generator, requests: int = 6) -> ContextMemory:
    """Task 0's requests did well on arm a, task 1's on arm b."""
    for i in range(requests):
        task = i % 2
        memory.add(memory.embed(prompt_like(task, rng)),
                   {"a": ArmStats(10, 9.0 if task == 0 else 1.0), "b": ArmStats(10, 1.0 if task == 0 else 9.0)})
    return memory


def test_a_prompt_like_earlier_ones_gets_the_arms_that_paid_for_them():
    rng = np.random.default_rng(0)
    memory = taught(ContextMemory(neighbours=3), rng)
    for task, best, worst in ((0, "a", "b"), (1, "b", "a")):
        prior = memory.prior(memory.embed(prompt_like(task, rng)))
        assert prior[best].mean == pytest.approx(0.9, abs=1e-6) and prior[worst].mean == pytest.approx(0.1, abs=1e-6)
        assert 0 < prior[best].pulls <= 30  # similarity-weighted evidence of the three neighbours


def test_no_prior_without_two_requests_or_for_a_context_of_another_width():
    memory = ContextMemory()
    assert memory.prior(memory.embed(np.ones(WIDTH))) == {}
    memory.add(memory.embed(np.ones(WIDTH)), {"a": ArmStats(1, 1.0)})
    assert memory.prior(memory.embed(np.ones(WIDTH))) == {}
    assert memory.embed(np.ones(WIDTH + 1)) is None and memory.embed([np.nan] * WIDTH) is None
    assert memory.embed(None) is None


def test_a_request_that_observed_nothing_is_not_remembered_and_the_oldest_go_first():
    memory = ContextMemory(capacity=3)
    memory.add(memory.embed(np.ones(WIDTH)), {"a": ArmStats()})
    assert len(memory) == 0
    for i in range(5):
        memory.add(memory.embed(np.full(WIDTH, float(i + 1))), {"a": ArmStats(1, float(i))})
    assert len(memory) == 3 and [arms["a"].reward_sum for arms in memory.arms] == [2.0, 3.0, 4.0]


def test_a_restored_memory_gives_the_same_prior_and_refuses_another_projection():
    rng = np.random.default_rng(1)
    memory = taught(ContextMemory(), rng)
    query = prompt_like(1, rng)
    snapshot = json.loads(json.dumps(memory.snapshot()))  # as the coordinator's checkpoint stores it
    restored = ContextMemory()
    assert restored.restore(snapshot)
    before, after = memory.prior(memory.embed(query)), restored.prior(restored.embed(query))
    assert {arm: s.mean for arm, s in after.items()} == pytest.approx({arm: s.mean for arm, s in before.items()}, abs=1e-4)
    other = ContextMemory(dims=16)
    assert not other.restore(snapshot) and len(other) == 0
