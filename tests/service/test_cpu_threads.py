"""A target replica on CPU shares the machine's cores with the other target replicas there: it
counts the live processes of its kind, takes cores // replicas torch threads (at least one), and
re-sizes as replicas come and go: a thread of its own recounts every few seconds, the forward
thread only applies the count. A target on a GPU takes every core."""
import subprocess
import threading
import time

import pytest
import torch

from deploy.service.cpu_threads import CpuThreads, process_kind, same_kind_here, threads_for


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


class Replicas:
    """A stand-in count of the target replicas here, recording the threads that counted."""

    def __init__(self, count: int) -> None:
        self.count, self.counted_in = count, []

    def __call__(self) -> int:
        self.counted_in.append(threading.current_thread())
        return self.count


def test_torch_threads_follow_the_replicas_here_as_last_counted(restored_threads):
    replicas = Replicas(1)
    threads = CpuThreads(count_replicas=replicas, cores=2, recount_s=3600)
    assert threads.refresh() == 2 and torch.get_num_threads() == 2  # the first refresh counts
    replicas.count = 2  # a second replica started here
    assert threads.refresh() == 2 and len(replicas.counted_in) == 1  # a refresh does not count
    assert threads.recount() == 2 // 2
    assert threads.refresh() == 1 and torch.get_num_threads() == 1
    replicas.count = 1  # it died
    threads.recount()
    assert threads.refresh() == 2 and torch.get_num_threads() == 2


def test_the_replicas_are_recounted_every_few_seconds_off_the_forward_thread(restored_threads):
    replicas = Replicas(1)
    threads = CpuThreads(count_replicas=replicas, cores=2, recount_s=0.05)
    assert threads.refresh() == 2
    replicas.count = 2
    deadline = time.monotonic() + 10
    while threads.refresh() != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threads.threads == 1 and torch.get_num_threads() == 1  # set in this (the forward) thread
    assert any(thread is not threading.current_thread() for thread in replicas.counted_in)


def test_a_target_on_a_gpu_takes_every_core_and_stops_counting(restored_threads):
    replicas = Replicas(2)
    threads = CpuThreads(count_replicas=replicas, cores=2, recount_s=0.05)
    assert threads.refresh() == 1  # before the target loads: a share
    threads.runs_on(torch.device("cuda"))
    assert threads.threads == 2 and torch.get_num_threads() == 2
    time.sleep(0.2)  # a count under way when it moved ends
    counted = len(replicas.counted_in)
    time.sleep(0.3)
    assert len(replicas.counted_in) == counted  # the counting thread stopped
    threads.recount()
    assert threads.refresh() == 2


def test_a_target_on_the_cpu_keeps_its_share(restored_threads):
    threads = CpuThreads(count_replicas=Replicas(2), cores=2, recount_s=3600)
    threads.refresh()
    threads.runs_on(torch.device("cpu"))
    assert threads.threads == 1 and torch.get_num_threads() == 1


def test_a_process_that_is_not_a_ray_actor_takes_every_core(restored_threads):
    assert CpuThreads(cores=2).refresh() == 2
