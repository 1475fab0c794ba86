"""How many threads torch gets in a target replica that runs on CPU: the cores this process may
run on, shared evenly among the target replicas on this machine.

A replica that took every core beside another that did too would oversubscribe them: two
replicas of 2 torch threads each on this 2-core machine answered a 64-token request in 20-30 s
each when both computed, where one alone took 2-3 s (libgomp's threads spin, waiting for each
other, while the other process holds the cores). So a replica counts the live processes of its
kind on this machine (Ray titles an actor's process `ray::<its class>`, plus `.<method>` while
one runs) and takes cores // replicas threads (at least 1). Replicas come and go (a replacement
starts, autoscaling adds one), so a daemon thread of `CpuThreads` recounts every RECOUNT_S (the
count takes about 2 ms: not in the forward thread's way) and stores the threads wanted;
`CpuThreads.refresh` sets torch's threads to that when it changed. It must run in the thread that
runs the forwards (OpenMP's thread count belongs to the calling thread), which the batch
scheduler does between iterations. A GPU target keeps every core (`CpuThreads.runs_on`).
"""
from __future__ import annotations

import logging
import os
import threading
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
                 recount_s: float = RECOUNT_S) -> None:
        """count_replicas: the target replicas on this machine (default: the live processes of
        this one's kind; a process that is not a Ray actor counts as alone)."""
        kind = process_kind(" ".join(psutil.Process().cmdline()))
        self.count_replicas = count_replicas or ((lambda: same_kind_here(kind)) if kind else (lambda: 1))
        self.cores = cores or len(os.sched_getaffinity(0))
        self.recount_s = recount_s
        self.shares_cores = True  # the target computes on this machine's cores (until `runs_on` a GPU)
        # written by the counting thread, read by the forward thread: one int assignment, atomic
        # under the GIL; the forward thread sees a new count at its next refresh
        self.wanted = 0
        self.threads = 0  # torch's threads as the forward thread last set them
        self._counter: threading.Thread | None = None

    def recount(self) -> int:
        """Count the target replicas here and store the threads this one wants; -> them."""
        self.wanted = threads_for(self.cores, self.count_replicas())
        return self.wanted

    def runs_on(self, device: torch.device) -> None:
        """Where the target's forwards run: off the CPU they leave its cores free, so torch's CPU
        threads take every core from now on (no more counting). Call it in the forward thread."""
        self.shares_cores = device.type == "cpu"
        self.refresh()

    def refresh(self) -> int:
        """In the forward thread: torch's threads set to the wanted count if it changed; -> the
        threads. The first call counts the replicas itself (before the target loads) and starts
        the counting thread."""
        if self._counter is None:
            self._start_counting()
        threads = self.wanted if self.shares_cores else self.cores
        if threads != self.threads:
            if self.threads and self.shares_cores:
                logger.info("torch threads %d -> %d (%d cores shared by the target replicas here)",
                            self.threads, threads, self.cores)
            torch.set_num_threads(threads)
            self.threads = threads
        return threads

    def _start_counting(self) -> None:
        """The first count, in the caller (once, before any forward), then the counting thread."""
        self.recount()
        self._counter = threading.Thread(target=self._count_every_period, name="specfleet-cpu-threads", daemon=True)
        self._counter.start()

    def _count_every_period(self) -> None:
        """The counting thread: recounts every recount_s while the target shares the cores."""
        while self.shares_cores:
            time.sleep(self.recount_s)
            if not self.shares_cores:
                return
            try:
                self.recount()
            except Exception:  # noqa: BLE001 - the threads stay as they are; count again next period
                logger.exception("counting the target replicas on this machine failed")
