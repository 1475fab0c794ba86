"""One prompt's outcome in one bench run: what the report aggregates.

`seconds` is the request's latency as its caller saw it (in-process: the engine call; service:
the HTTP round trip). `trace` lists (drafter, drafted, accepted) per round where the run can see
its rounds (in-process engine runs); peers and service runs leave it empty. `profiled_s` is the
same request re-timed with a device's cost profile (deploy/bench/cost_profile.py), where given.
`first_token_s` is the time to its first token where the run can see it (a streamed service
request, the batching peers); None otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from deploy.bench.cost_profile import CostProfile
from deploy.engine.request import GenerationResult


@dataclass(frozen=True)
class Sample:
    token_ids: list[int]
    seconds: float
    rounds: int
    per_drafter: dict
    coordinator_s: float  # the target's draft calls, round trip
    verify_s: float
    trace: tuple[tuple[str, int, int], ...] = field(default=())
    profiled_s: float | None = None
    first_token_s: float | None = None

    @classmethod
    def from_result(cls, result: GenerationResult, seconds: float, profile: CostProfile | None = None) -> "Sample":
        s = result.summary
        trace = tuple((r.drafter, r.drafted, r.accepted) for r in result.rounds)
        profiled = profile.request_s([(r.drafted + 1, r.parallel_draft_s) for r in result.rounds]) if profile else None
        return cls(result.token_ids, seconds, s["rounds"], s["per_drafter"], s["draft_s"], s["verify_s"], trace, profiled)

    @classmethod
    def from_http(cls, body: dict, seconds: float, first_token_s: float | None = None) -> "Sample":
        if "metrics" not in body:
            raise RuntimeError("the service returns no per-request metrics: serve it with --request-metrics "
                               "(the config's request_metrics: true) to bench it")
        metrics = body["metrics"]
        return cls(body["choices"][0]["token_ids"], seconds, metrics["timing"]["rounds"],
                   metrics["speculative_decoding"]["per_drafter"], metrics["timing"]["coordinator_s"],
                   metrics["timing"]["verify_s"], first_token_s=first_token_s)

    @classmethod
    def from_tokens(cls, token_ids: list[int], seconds: float, first_token_s: float | None = None) -> "Sample":
        """A run that exposes no rounds (a peer's `generate`)."""
        return cls(token_ids, seconds, 0, {}, 0.0, 0.0, first_token_s=first_token_s)
