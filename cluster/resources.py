"""Resource requests for the drafter pool: pure arithmetic, no Ray.

Every drafter is its own Ray actor. By default each drafter that drafts gets one GPU of its own
when the cluster has GPUs (the no-draft arm never needs one); a drafter's `num_gpus` overrides
that. Drafters that ask for resources are reserved together in one placement group, one bundle
each, with the config's strategy (`PACK`: as few nodes as possible; `SPREAD`: across nodes;
`STRICT_*`: or fail); drafters that ask for nothing are scheduled anywhere.
"""
from __future__ import annotations

from collections.abc import Sequence

from actors.no_draft import NO_DRAFT
from cluster.drafter_actor import DrafterSpec


def bundle(spec: DrafterSpec) -> dict[str, float]:
    """The drafter's placement-group bundle ({} when it asks for nothing)."""
    wanted = (("GPU", spec.num_gpus), ("CPU", spec.num_cpus), *spec.resources)
    return {key: value for key, value in wanted if value > 0}


def drafter_gpus(kind: str, requested: float | None, cluster_gpus: float) -> float:
    """GPUs for one drafter actor: `requested` when set, else 1 on a GPU cluster (0 for `none`)."""
    if requested is not None:
        return requested
    return 1.0 if cluster_gpus >= 1 and kind != NO_DRAFT else 0.0


def target_gpus(requested: float | None, cluster_gpus: float) -> float:
    """GPUs for one target replica: `requested` when set, else 1 on a GPU cluster."""
    if requested is not None:
        return requested
    return 1.0 if cluster_gpus >= 1 else 0.0


def bundle_indices(drafters: Sequence[DrafterSpec]) -> dict[str, int]:
    """Drafter name -> its bundle's index in the pool's placement group (only drafters with a bundle)."""
    placed = [d.name for d in drafters if bundle(d)]
    return {name: index for index, name in enumerate(placed)}
