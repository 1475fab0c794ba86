"""A target replica on CPU shares the machine's cores with the other target replicas there: it
counts the live processes of its kind, takes cores // replicas torch threads (at least one), and
re-sizes as replicas come and go, at most every few seconds."""
import subprocess

import pytest
import torch

from deploy.service.cpu_threads import CpuThreads, process_kind, same_kind_here, threads_for


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def restored_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_replicas_on_one_machine_split_its_cores_and_each_keeps_at_least_one():
    assert [threads_for(2, n) for n in (1, 2, 3)] == [2, 1, 1]
    assert [threads_for(16, n) for n in (1, 2, 3, 4)] == [16, 8, 5, 4]


def test_a_ray_actors_kind_is_its_class_whatever_method_it_runs():
    replica = "ray::ServeReplica:specfleet:SpecfleetServer"
    assert process_kind(replica) == process_kind(replica + ".handle_request_streaming") == replica
    assert process_kind("ray::ServeReplica:specfleet:SpecfleetFront") != replica
    assert process_kind("/usr/bin/python -m deploy.cli serve") is None


def test_the_live_processes_of_a_kind_on_this_machine_are_counted():
    kind = "ray::SpecfleetTestKind"
    before = same_kind_here(kind)
    sleepers = [subprocess.Popen(["bash", "-c", f"exec -a {kind}{suffix} sleep 30"]) for suffix in ("", ".method")]
    try:
        for _ in range(50):  # exec has replaced the shell's title
            if same_kind_here(kind) == before + 2:
                break
            subprocess.run(["sleep", "0.1"])
        assert same_kind_here(kind) == before + 2
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    assert same_kind_here(kind) == before


def test_torch_threads_follow_the_replicas_here_rechecked_at_most_every_few_seconds(restored_threads):
    replicas, clock = [1], Clock()
    threads = CpuThreads(count_replicas=lambda: replicas[0], cores=2, recount_s=5, clock=clock)
    assert threads.refresh() == 2 and torch.get_num_threads() == 2
    replicas[0] = 2  # a second replica started here
    clock.now = 4
    assert threads.refresh() == 2  # not recounted yet
    clock.now = 5
    assert threads.refresh() == 1 and torch.get_num_threads() == 1
    replicas[0] = 1  # it died
    clock.now = 10
    assert threads.refresh() == 2 and torch.get_num_threads() == 2


def test_a_process_that_is_not_a_ray_actor_takes_every_core(restored_threads):
    assert CpuThreads(cores=2).refresh() == 2
