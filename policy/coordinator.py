"""The coordinator: the only holder of bandit state. It picks the drafter for each round,
dispatches drafting to it, and learns from the target's verification feedback.

One call per speculation round from the target:

    propose(request_id, new_tokens, feedback, k, sampling) -> Proposal

`new_tokens` are the tokens the target committed since its previous call (the prompt on the
first call); `feedback` describes the previous round (feedback for round t rides on the call of
round t+1). The coordinator keeps per request the committed context, the request's bandit
(cold, or warm-started from global statistics with `-warm`) and how much of the context
each drafter has seen, so a drafter receives only its unseen tokens (catch-up after rounds it sat
out). `finish` learns the last round and releases every drafter's session.

`Coordinator` is a plain class (tested without Ray); `CoordinatorActor` is its async Ray actor
body, and `start_coordinator_actor` applies `ray.remote` at build time and names the actor
`specfleet:coordinator`.
"""
from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from actors.no_draft import NO_DRAFT
from actors.proposal import Proposal, Proposer
from deploy.sampling import SamplingParams
from policy.bandit import ArmStats, Bandit
from policy.registry import DEFAULT_POLICY, parse_policy

COORDINATOR_NAME = "specfleet:coordinator"


@dataclass(frozen=True)
class Feedback:
    """The target's verdict on one round, reward already computed with `Coordinator.reward_kind`."""

    drafter: str
    drafted: int
    accepted: int
    reward: float


@dataclass
class _Request:
    bandit: Bandit
    tokens: list[int] = field(default_factory=list)
    sent: dict[str, int] = field(default_factory=dict)  # committed tokens each drafter has seen


@dataclass
class DrafterStats:
    pulls: int = 0
    drafted: int = 0
    accepted: int = 0
    reward_sum: float = 0.0


class Coordinator:
    def __init__(self, drafters: Mapping[str, Proposer], policy: str = DEFAULT_POLICY, seed: int = 0) -> None:
        self.drafters = dict(drafters)
        self.spec = parse_policy(policy, list(self.drafters))
        self.global_stats: dict[str, ArmStats] = {arm: ArmStats() for arm in self.spec.arms}
        self.drafter_stats: dict[str, DrafterStats] = {name: DrafterStats() for name in self.drafters}
        self.requests: dict[str, _Request] = {}
        self._rng = np.random.default_rng(seed)
        self._lock = threading.Lock()  # guards bandits and statistics, never held while drafting

    @property
    def reward_kind(self) -> str:
        return self.spec.reward

    @property
    def policy(self) -> str:
        return self.spec.name

    def select(
        self, request_id: str, new_tokens: Sequence[int], feedback: Feedback | None, k: int
    ) -> tuple[str, list[int]] | None:
        """Record the committed tokens and the feedback, pick this round's drafter.

        -> (drafter, the committed tokens it has not seen yet), or None when k <= 0 (no room to
        draft: a plain step that nobody learns from).
        """
        with self._lock:
            request = self.requests.get(request_id)
            if request is None:
                rng = np.random.default_rng(self._rng.integers(2**63))
                request = self.requests[request_id] = _Request(self.spec.make(self.global_stats, rng))
            request.tokens.extend(int(t) for t in new_tokens)
            if feedback is not None:
                self._learn(request, feedback)
            if k <= 0:
                return None
            arm = request.bandit.select(1)[0]
            delta = request.tokens[request.sent.get(arm, 0) :]
            request.sent[arm] = len(request.tokens)
            return arm, delta

    @staticmethod
    def as_round(arm: str, proposal: Proposal, k: int) -> Proposal:
        """The drafter's proposal under the arm's name, at most k tokens."""
        q = proposal.q[:k] if proposal.q is not None else None
        return Proposal(arm, proposal.token_ids[:k], q, proposal.draft_s)

    def propose(
        self,
        request_id: str,
        new_tokens: Sequence[int],
        feedback: Feedback | None,
        k: int,
        sampling: SamplingParams,
    ) -> Proposal:
        choice = self.select(request_id, new_tokens, feedback, k)
        if choice is None:
            return Proposal(drafter=NO_DRAFT)
        arm, delta = choice
        return self.as_round(arm, self.drafters[arm].propose(request_id, delta, k, sampling), k)

    def close(self, request_id: str, new_tokens: Sequence[int] = (), feedback: Feedback | None = None) -> dict[str, list[int]]:
        """Learn the last round and forget the request. -> per drafter, the tokens it has not seen."""
        with self._lock:
            request = self.requests.pop(request_id, None)
            if request is None:
                return {}
            request.tokens.extend(int(t) for t in new_tokens)
            if feedback is not None:
                self._learn(request, feedback)
        return {name: request.tokens[request.sent.get(name, 0) :] for name in self.drafters}

    def finish(self, request_id: str, new_tokens: Sequence[int] = (), feedback: Feedback | None = None) -> None:
        for name, delta in self.close(request_id, new_tokens, feedback).items():
            self.drafters[name].release(request_id, delta)

    def _learn(self, request: _Request, feedback: Feedback) -> None:
        request.bandit.update(feedback.drafter, feedback.reward)
        if feedback.drafter in self.global_stats:
            self.global_stats[feedback.drafter].add(feedback.reward)
        stats = self.drafter_stats.get(feedback.drafter)
        if stats is not None:
            stats.pulls += 1
            stats.drafted += feedback.drafted
            stats.accepted += feedback.accepted
            stats.reward_sum += feedback.reward

    def stats(self) -> dict:
        """Pulls, mean reward and acceptance per drafter, plus the number of open requests."""
        with self._lock:
            return {
                "policy": self.spec.name,
                "reward": self.spec.reward,
                "active_requests": len(self.requests),
                "drafters": {
                    name: {
                        "pulls": s.pulls,
                        "drafted": s.drafted,
                        "accepted": s.accepted,
                        "acceptance": s.accepted / s.drafted if s.drafted else None,
                        "mean_reward": s.reward_sum / s.pulls if s.pulls else None,
                    }
                    for name, s in self.drafter_stats.items()
                },
            }


class CoordinatorActor:
    """The async Ray actor body: `Coordinator`'s bandit logic, drafting awaited on drafter actors,
    so concurrent requests' rounds never wait on each other's drafting."""

    def __init__(self, drafters: Mapping[str, object], policy: str = DEFAULT_POLICY, seed: int = 0) -> None:
        self.core = Coordinator(drafters, policy, seed)  # values are drafter actor handles

    async def propose(self, request_id, new_tokens, feedback, k, sampling) -> Proposal:
        choice = self.core.select(request_id, new_tokens, feedback, k)
        if choice is None:
            return Proposal(drafter=NO_DRAFT)
        arm, delta = choice
        proposal = await self.core.drafters[arm].propose.remote(request_id, delta, k, sampling)
        return Coordinator.as_round(arm, proposal, k)

    async def finish(self, request_id, new_tokens=(), feedback=None) -> None:
        for name, delta in self.core.close(request_id, new_tokens, feedback).items():
            self.core.drafters[name].release.remote(request_id, delta)  # fire and forget, ordered per caller

    async def stats(self) -> dict:
        return self.core.stats()


def start_coordinator_actor(drafters: Mapping[str, object], policy: str = DEFAULT_POLICY, seed: int = 0):
    """The named async actor `specfleet:coordinator` over drafter actor handles."""
    import ray

    from cluster.local import NAMESPACE

    actor = ray.remote(CoordinatorActor).options(
        name=COORDINATOR_NAME, namespace=NAMESPACE, num_cpus=0, max_concurrency=256, lifetime="detached",
    )
    return actor.remote(dict(drafters), policy, seed)


def connect_coordinator() -> "RemoteCoordinator":
    """The running coordinator actor, looked up by name in the `specfleet` namespace."""
    import ray

    from cluster.local import NAMESPACE

    return RemoteCoordinator(ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE))


class RemoteCoordinator:
    """The engine-facing interface (`propose`, `finish`, `reward_kind`) over the coordinator actor."""

    def __init__(self, handle) -> None:
        import ray

        self.handle = handle
        self.reward_kind = ray.get(handle.stats.remote())["reward"]

    def propose(self, request_id, new_tokens, feedback, k, sampling) -> Proposal:
        import ray

        return ray.get(self.handle.propose.remote(request_id, list(new_tokens), feedback, k, sampling))

    def finish(self, request_id, new_tokens=(), feedback=None) -> None:
        import ray

        ray.get(self.handle.finish.remote(request_id, list(new_tokens), feedback))

    def stats(self) -> dict:
        import ray

        return ray.get(self.handle.stats.remote())
