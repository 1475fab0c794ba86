"""What the engine asks of a coordinator: the interface the local `policy.coordinator.Coordinator`
and the Ray actor's proxy (`cluster.coordinator_actor.RemoteCoordinator`) both provide.

One `propose_batch` call per iteration carries every request's new tokens, the previous round's
feedback and its unsent features; it answers each request's `DraftRound`. A round may name
`deferred` model drafters (a local coordinator drafts in one process and leaves the costly ones
to a second call, sized by the engine: `draft_deferred`); a coordinator that drafts in parallel
defers none. `finish` hands over a request's last tokens and feedback and frees its sessions. A coordinator
shared by several target replicas may also pool their draft-length statistics (`pool_lengths`,
deploy/engine/shared_lengths.py) and seed each other's draft guards (`pool_guard`); one without
them leaves each engine to its own.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from typing import Protocol

from actors.proposal import Proposal
from actors.sampling import SamplingParams
from policy.coordinator import DraftCall, DraftRound, RoundFeedback


class DraftCoordinator(Protocol):
    @property
    def reward_kind(self) -> str:
        """The reward the policy learns from (policy/reward.py): the engine computes it."""

    @property
    def wants_features(self) -> bool:
        """A drafter of the pool reads the target's hidden states: the engine collects them."""

    def propose_batch(self, calls: Sequence[DraftCall]) -> list[DraftRound]: ...

    def draft_deferred(self, request_id: str, tokens: Mapping[str, int], sampling: SamplingParams) -> tuple[Proposal, ...]: ...

    def finish(self, request_id: str, new_tokens: Sequence[int] = (), feedback: RoundFeedback | None = None) -> None: ...

    def pool_lengths(self, delta: Mapping[str, list[list[float]]]) -> Mapping[str, list[list[float]]] | Future:
        """Optional: add a replica's new draft-length counts to the pool's; -> the totals (or a Future of them)."""

    def pool_guard(self, state: Mapping[str, list[float]]) -> Mapping[str, list[float]] | Future:
        """Optional: a replica's draft-guard figures per batch bucket; -> the best-evidenced replica's (or a Future)."""
