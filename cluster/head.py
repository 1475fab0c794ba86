"""Run a function on the Ray cluster's head node and return its result.

The service's secrets (API key file, admin token) live on the head node only (docs/cluster.md:
`ray rsync-up` puts them there, never on workers), while Serve may build the application in a
task on any node. `on_head(fn, *args)` calls `fn` in this process when it runs on the head (a
single machine always does), else in a zero-CPU task pinned to the head; what comes back (API key
digests, deploy/service/auth.py) is all the rest of the cluster ever sees. An exception in `fn`
is raised here as its own type.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

HEAD_RESOURCE = "node:__internal_head__"  # the resource Ray gives the head node alone
Result = TypeVar("Result")


def head_node_id() -> str:
    heads = [node["NodeID"] for node in ray.nodes() if node["Alive"] and HEAD_RESOURCE in node["Resources"]]
    if not heads:
        raise RuntimeError("the Ray cluster has no live head node")
    return heads[0]


def on_head(fn: Callable[..., Result], *args) -> Result:
    head = head_node_id()
    if ray.get_runtime_context().get_node_id() == head:
        return fn(*args)
    task = ray.remote(num_cpus=0, max_retries=0)(fn).options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(head, soft=False))
    return ray.get(task.remote(*args))
