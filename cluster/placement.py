"""Placement groups for drafter actors, and where a Ray process runs.

`reserve(name, bundles, strategy, timeout_s)` creates a detached, named placement group and
waits until the cluster grants it (on an autoscaling cluster, pending bundles are what makes the
autoscaler add GPU nodes); on timeout it removes the group and raises `PlacementError` naming the
bundles asked for and the resources the cluster has. `release(name)` removes a live group (or,
with prefix=True, every group whose name starts with `name`). `cluster_gpus()` counts the
cluster's GPUs; `here()` reports the calling process's node and the GPU ids Ray assigned it (the
ids are Ray's; a process without CUDA still runs, on the CPU).
"""
from __future__ import annotations

from collections.abc import Sequence


class PlacementError(RuntimeError):
    pass


def reserve(name: str, bundles: Sequence[dict[str, float]], strategy: str, timeout_s: float):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    group = placement_group(list(bundles), strategy=strategy, name=name, lifetime="detached")
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        raise PlacementError(
            f"placement group {name!r} ({strategy}, bundles {list(bundles)}) not granted within {timeout_s:g} s; "
            f"the cluster has {ray.cluster_resources()} ({ray.available_resources()} free)")
    return group


def in_bundle(group, index: int):
    """The scheduling strategy that puts an actor into bundle `index` of `group`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=group, placement_group_bundle_index=index)


def release(name: str, prefix: bool = False) -> list[str]:
    """Remove the live placement group `name` (every one named `name...` with prefix=True); -> their names."""
    from ray.util.placement_group import get_placement_group, placement_group_table, remove_placement_group

    removed = []
    for entry in placement_group_table().values():
        group = entry.get("name") or ""
        if (group.startswith(name) if prefix else group == name) and entry.get("state") != "REMOVED":
            remove_placement_group(get_placement_group(group))
            removed.append(group)
    return removed


def cluster_gpus() -> float:
    """GPUs in the whole cluster (0 on a CPU cluster)."""
    import ray

    return ray.cluster_resources().get("GPU", 0.0)


def here() -> dict:
    """{"node": node id, "node_ip": address, "gpu": [Ray's GPU ids], "pid": process id} of the calling process."""
    import os

    import ray

    node = ray.get_runtime_context().get_node_id()
    address = next((n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node), None)  # the node's own
    return {"node": node, "node_ip": address, "gpu": [str(g) for g in ray.get_gpu_ids()], "pid": os.getpid()}


def actor_name() -> str:
    """The calling actor's name ("" outside a named actor)."""
    import ray

    return ray.get_runtime_context().get_actor_name() or ""
