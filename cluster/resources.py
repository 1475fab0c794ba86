"""Resource requests for the drafter pool: pure arithmetic, no Ray.

A drafter that runs a model is a Ray actor of its own, on a GPU of its own when the cluster has
GPUs (its `num_gpus` overrides that). A drafter that needs no model (n-gram, suffix cache,
retrieval, the hierarchy of those, the no-draft arm) and asks for no resources drafts inside the
coordinator actor: a lookup takes microseconds, a Ray call to an actor of its own a millisecond or
more per round (docs/design.md, "Where a served request's time goes"); given resources, it gets
an actor of its own too. Drafters that ask for resources are reserved together in one placement group, one bundle
each, with the config's strategy (`PACK`: as few nodes as possible; `SPREAD`: across nodes;
`STRICT_*`: or fail); drafters that ask for nothing are scheduled anywhere.
"""
from __future__ import annotations

from collections.abc import Sequence

from actors.pool import needs_model
from cluster.drafter_actor import DrafterSpec


def bundle(spec: DrafterSpec) -> dict[str, float]:
    """The drafter's placement-group bundle ({} when it asks for nothing)."""
    wanted = (("GPU", spec.num_gpus), ("CPU", spec.num_cpus), *spec.resources)
    return {key: value for key, value in wanted if value > 0}


def drafter_gpus(kind: str, model: str | None, requested: float | None, cluster_gpus: float) -> float:
    """GPUs for one drafter: `requested` when set, else 1 on a GPU cluster for one that runs a model."""
    if requested is not None:
        return requested
    return 1.0 if cluster_gpus >= 1 and needs_model(kind, model) else 0.0


def drafts_in_coordinator(spec: DrafterSpec) -> bool:
    """A drafter that needs no model and asks for no resources drafts inside the coordinator actor."""
    return not needs_model(spec.kind, spec.model) and not bundle(spec)


def target_gpus(requested: float | None, cluster_gpus: float) -> float:
    """GPUs for one target replica: `requested` when set, else 1 on a GPU cluster."""
    if requested is not None:
        return requested
    return 1.0 if cluster_gpus >= 1 else 0.0


def bundle_indices(drafters: Sequence[DrafterSpec]) -> dict[str, int]:
    """Drafter name -> its bundle's index in the pool's placement group (only drafters with a bundle)."""
    placed = [d.name for d in drafters if bundle(d)]
    return {name: index for index, name in enumerate(placed)}
