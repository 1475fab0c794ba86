"""How many threads torch gets in a target replica that runs on CPU: the cores this process may
run on, shared evenly among the target replicas on this machine.

A replica that took every core beside another that did too would oversubscribe them: two
replicas of 2 torch threads each on this 2-core machine answered a 64-token request in 20-30 s
each when both computed, where one alone took 2-3 s (libgomp's threads spin, waiting for each
other, while the other process holds the cores). So a replica counts the live processes of its
kind on this machine (Ray titles an actor's process `ray::<its class>`, plus `.<method>` while
one runs) and takes cores // replicas threads (at least 1). Replicas come and go (a replacement
starts, autoscaling adds one), so `CpuThreads.refresh` recounts at most every RECOUNT_S; it must
run in the thread that runs the forwards (OpenMP's thread count belongs to the calling thread),
which the batch scheduler does between iterations. A GPU target keeps every core.
"""
from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

import psutil
import torch

RECOUNT_S = 5.0
logger = logging.getLogger("ray.serve")  # under Serve: the replica's own log file


def process_kind(title: str) -> str | None:
    """A Ray actor process's kind from its title (`ray::Class` or `ray::Class.method`); None for a
    process that is not a Ray actor."""
    return title.split(" ", 1)[0].split(".", 1)[0] if title.startswith("ray::") else None


def same_kind_here(kind: str) -> int:
    """The live processes on this machine whose kind is `kind` (this one included)."""
    count = 0
    for process in psutil.process_iter(["cmdline"]):
        try:
            title = " ".join(process.info["cmdline"] or [])
        except psutil.Error:  # it exited while we looked
            continue
        count += process_kind(title) == kind
    return count


def threads_for(cores: int, replicas: int) -> int:
    return max(1, cores // max(1, replicas))


class CpuThreads:
    """torch's threads for this replica's forwards, re-sized as replicas on this machine come and go."""

    def __init__(self, count_replicas: Callable[[], int] | None = None, cores: int | None = None,
                 recount_s: float = RECOUNT_S, clock: Callable[[], float] = time.monotonic) -> None:
        """count_replicas: the target replicas on this machine (default: the live processes of
        this one's kind; a process that is not a Ray actor counts as alone)."""
        kind = process_kind(" ".join(psutil.Process().cmdline()))
        self.count_replicas = count_replicas or ((lambda: same_kind_here(kind)) if kind else (lambda: 1))
        self.cores = cores or len(os.sched_getaffinity(0))
        self.recount_s, self.clock = recount_s, clock
        self.threads = 0
        self._counted_at = float("-inf")

    def refresh(self) -> int:
        """Re-size torch's threads (in the calling thread) if due and the count changed; -> the threads."""
        now = self.clock()
        if now - self._counted_at < self.recount_s:
            return self.threads
        self._counted_at = now
        threads = threads_for(self.cores, self.count_replicas())
        if threads != self.threads:
            if self.threads:
                logger.info("torch threads %d -> %d (%d cores shared by the target replicas here)",
                            self.threads, threads, self.cores)
            torch.set_num_threads(threads)
            self.threads = threads
        return threads
