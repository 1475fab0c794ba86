"""Drafter actors: any drafter kind behind a named Ray actor `specfleet:drafter:<name>`.

`DrafterActor` is a plain class that builds its Proposer inside the actor process (a model
drafter loads its model onto the GPU Ray assigned, or the CPU when CUDA is absent) and serves
`propose` / `release` with per-request sessions, and `placement` (its node, Ray's GPU ids and the
torch device it drafts on: the CPU when CUDA is absent, even on a GPU Ray assigned).
`named_drafters()` finds the ones alive. `start_drafter_actor` applies `ray.remote` at build time with the spec's resources (inside a
placement-group bundle when given one); the coordinator actor awaits its calls.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from actors.models import DEFAULT_MODEL
from actors.proposal import Proposal, Proposer, is_model_free, needs_features
from actors.sampling import SamplingParams
from cluster.local import NAMESPACE

DRAFTER_PREFIX = "specfleet:drafter:"


def named_drafters() -> dict[str, object]:
    """The drafter actors alive in the `specfleet` namespace, by drafter name ({} outside Ray)."""
    import ray

    if not ray.is_initialized():
        return {}
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
             if a["namespace"] == NAMESPACE and a["name"].startswith(DRAFTER_PREFIX)]
    return {name.removeprefix(DRAFTER_PREFIX): ray.get_actor(name, namespace=NAMESPACE) for name in names}


@dataclass(frozen=True)
class DrafterSpec:
    name: str
    kind: str
    model: str | None = None  # draft model for `hf` (and the hierarchy's last resort); the head directory for `eagle`
    target: str = DEFAULT_MODEL  # the target's name (an `eagle` head is trained for one target)
    num_layers: int | None = None
    dtype: str = "float32"
    num_gpus: float = 0.0
    num_cpus: float = 0.0
    resources: tuple[tuple[str, float], ...] = ()  # custom Ray resources


def build_proposer(spec: DrafterSpec, target_vocab_size: int | None) -> Proposer:
    """The drafter `spec` describes, built in this process (its actor's, or the coordinator's for a
    drafter that needs no model and asks for no resources: cluster/resources.py)."""
    from actors.models import load_draft_model
    from actors.pool import build_drafters

    draft_model = None
    if spec.model is not None and spec.kind != "eagle":
        draft_model = load_draft_model(spec.model, dtype=spec.dtype, num_layers=spec.num_layers)
    eagle_head = spec.model if spec.kind == "eagle" else None  # an eagle drafter's `model` is its head directory
    return build_drafters([spec.kind], draft_model, target_vocab_size, spec.target, eagle_head)[spec.kind]


def open_sessions(proposer: Proposer) -> int:
    """The requests a drafter holds a session for (0 for one that keeps none)."""
    sessions = getattr(proposer, "sessions", None)
    return len(sessions) if sessions is not None else 0


class DrafterActor:
    def __init__(self, spec: DrafterSpec, target_vocab_size: int) -> None:
        self.spec = spec
        self.proposer = build_proposer(spec, target_vocab_size)

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        return self.proposer.propose(session, context_delta, k, sampling)

    def propose_batch(self, calls: Sequence[tuple]) -> list[Proposal]:
        """`propose` for every (session, context_delta, k, sampling[, features]) of a batch iteration, in one call."""
        return [self.proposer.propose(*call) for call in calls]

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.proposer.release(session, context_delta)

    def kind(self) -> dict:
        """What the coordinator asks once: whether it drafts without a model (then it can be a
        shadow every round) and whether it reads the target's features."""
        return {"model_free": is_model_free(self.proposer), "needs_features": needs_features(self.proposer)}

    def placement(self) -> dict:
        from cluster.placement import here

        parts = [self.proposer, *getattr(self.proposer, "sources", ())]  # a hierarchy's model source
        devices = [str(p.device) for p in parts if getattr(p, "device", None) is not None]
        return {"kind": self.spec.kind, "model": self.spec.model} | here() | {"device": devices[0] if devices else "cpu"}

    def rss_bytes(self) -> int:
        """This actor process's resident memory (for leak checks)."""
        import psutil

        return psutil.Process().memory_info().rss

    def open_sessions(self) -> int:
        return open_sessions(self.proposer)


def start_drafter_actor(spec: DrafterSpec, target_vocab_size: int, scheduling_strategy=None):
    import ray

    from cluster.local import NAMESPACE

    actor = ray.remote(DrafterActor).options(
        name=DRAFTER_PREFIX + spec.name, namespace=NAMESPACE, num_gpus=spec.num_gpus, num_cpus=spec.num_cpus,
        resources=dict(spec.resources), max_restarts=-1, max_task_retries=0, lifetime="detached",
        scheduling_strategy=scheduling_strategy,
    )
    return actor.remote(spec, target_vocab_size)
