"""The speculative engine: one request's draft -> verify -> accept loop on the target.

Per round: one coordinator call (the newly committed tokens and the previous round's feedback
go in, a proposal of up to k tokens comes out: the coordinator's bandit chose the drafter); one
target forward over [last token, draft] gives p for every draft position plus the bonus
position; `verify` accepts losslessly; the target's KV cache is cropped to the accepted path;
the round's reward (computed here, where the timings are) rides on the next call. The no-draft
arm, an empty proposal or a one-token budget make the round a plain target step. Greedy output
equals plain decoding token for token; sampled output follows the target's distribution.
"""
from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from actors.no_draft import NO_DRAFT
from actors.proposal import Proposer
from deploy.errors import InvalidRequestError
from deploy.sampling import SamplingParams
from deploy.target import TargetModel
from deploy.verify import verify
from policy.coordinator import Coordinator, Feedback
from policy.registry import DEFAULT_POLICY
from policy.reward import BD, COST, round_reward

MAX_K = 32


@dataclass(frozen=True)
class RoundTrace:
    drafter: str
    drafted: int
    accepted: int
    emitted: int
    reward: float
    draft_s: float  # the coordinator call as the target saw it (selection, RPCs, drafting)
    verify_s: float
    drafter_s: float = 0.0  # the drafter's own drafting time


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length"
    prompt_tokens: int
    rounds: list[RoundTrace] = field(default_factory=list)

    @property
    def summary(self) -> dict:
        per_drafter: dict[str, dict[str, int]] = {}
        for r in self.rounds:
            d = per_drafter.setdefault(r.drafter, {"steps": 0, "drafted": 0, "accepted": 0})
            d["steps"] += 1
            d["drafted"] += r.drafted
            d["accepted"] += r.accepted
        drafted = sum(r.drafted for r in self.rounds)
        accepted = sum(r.accepted for r in self.rounds)
        return {
            "rounds": len(self.rounds),
            "num_spec_steps": sum(1 for r in self.rounds if r.drafted),
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": accepted,
            "draft_acceptance_rate": accepted / drafted if drafted else None,
            "mean_acceptance_length": len(self.token_ids) / len(self.rounds) if self.rounds else None,
            "draft_s": sum(r.draft_s for r in self.rounds),
            "verify_s": sum(r.verify_s for r in self.rounds),
            "per_drafter": per_drafter,
        }

    def to_dict(self, trace: bool = False) -> dict:
        out = {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason, "stats": self.summary}
        if trace:
            out["rounds"] = [asdict(r) for r in self.rounds]
        return out


class SpeculativeEngine:
    """Runs requests against one target. Drafting goes through a coordinator: a local
    `Coordinator` over `drafters` (default), or any object with the same `propose` / `finish` /
    `reward_kind` (the Ray coordinator actor's proxy)."""

    def __init__(
        self,
        target: TargetModel,
        drafters: Mapping[str, Proposer] | None = None,
        policy: str = DEFAULT_POLICY,
        k: int = 7,
        seed: int = 0,
        max_padding: int = 4,
        coordinator: Coordinator | None = None,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
            raise InvalidRequestError("k", f"must be an integer in 1..{MAX_K}, got {k!r}")
        if (drafters is None) == (coordinator is None):
            raise ValueError("give drafters (a local coordinator is built) or a coordinator, not both")
        self.target, self.k = target, k
        self.coordinator = coordinator if coordinator is not None else Coordinator(drafters, policy, seed)
        self.reward_kind = self.coordinator.reward_kind
        self._seeds = np.random.default_rng(seed)
        self._seed_lock = threading.Lock()
        # Forward sizes cost non-monotonically on CPU (measured once per target): a draft's forward
        # is padded with up to max_padding throwaway positions when a larger size is cheaper.
        self.max_positions = k + 1 + max_padding
        only_plain = drafters is not None and set(drafters) == {NO_DRAFT}
        # padded_size[n]: the forward size for n positions (the cheapest size >= n)
        self.padded_size = list(range(self.max_positions + 1))
        if max_padding and not only_plain:
            self.padded_size = [target.padded_length(n, self.max_positions) for n in self.padded_size]
        self.plain_step_s = target.plain_step_s() if self.reward_kind == COST else 0.0

    def generate(
        self,
        *,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        token_ids: Sequence[int] | None = None,
        sampling: SamplingParams = SamplingParams(),
    ) -> GenerationResult:
        return self.run(self.target.encode(prompt=prompt, messages=messages, token_ids=token_ids), sampling)

    def run(self, prompt_ids: list[int], sampling: SamplingParams, on_tokens=None) -> GenerationResult:
        """Generate from prompt token ids; `on_tokens(list[int])` is called with each round's output."""
        self.target.check_length(len(prompt_ids), sampling.max_tokens)
        request_id = uuid.uuid4().hex
        with self._seed_lock:
            seed = sampling.seed if sampling.seed is not None else int(self._seeds.integers(2**62))
        generator = torch.Generator().manual_seed(seed)
        tokens = list(prompt_ids)  # committed context; the cache always covers tokens[:-1]
        sent = 0  # committed tokens the coordinator has seen
        cache = self.target.new_cache()
        if len(tokens) > 1:
            self.target.forward(cache, tokens[:-1], logits_for=0)  # prefill: only the K/V cache is needed
        output: list[int] = []
        rounds: list[RoundTrace] = []
        feedback: Feedback | None = None
        finish: str | None = None
        try:
            while finish is None:
                budget = min(self.k, sampling.max_tokens - len(output) - 1)  # leaves room for the bonus
                start = time.perf_counter()
                proposal = self.coordinator.propose(request_id, tokens[sent:], feedback, budget, sampling)
                draft_s = time.perf_counter() - start
                sent = len(tokens)
                draft, q = proposal.token_ids, proposal.q  # the coordinator caps both at budget
                start = time.perf_counter()
                positions = [tokens[-1], *draft]
                if draft:  # extra positions only change speed; their K/V is cropped
                    positions += [draft[-1]] * (self.padded_size[len(positions)] - len(positions))
                logits = self.target.forward(cache, positions, logits_for=len(draft) + 1)  # [d+1, V]
                result = verify(draft, q, logits, sampling, generator, with_overlaps=self.reward_kind == BD)
                self.target.crop(cache, len(tokens) + result.accepted)
                verify_s = time.perf_counter() - start
                if not draft and self.plain_step_s:
                    self.plain_step_s = 0.9 * self.plain_step_s + 0.1 * verify_s  # track the plain step's cost
                reward = round_reward(
                    self.reward_kind, accepted=result.accepted, drafted=len(draft), overlaps=result.overlaps,
                    draft_s=draft_s, verify_s=verify_s, plain_step_s=self.plain_step_s, k=self.k,
                )
                feedback = Feedback(proposal.drafter, len(draft), result.accepted, reward) if budget > 0 else None
                before = len(output)
                emitted, finish = self._emit(output, result.token_ids, sampling)
                tokens.extend(result.token_ids)
                rounds.append(RoundTrace(proposal.drafter, len(draft), result.accepted, emitted, reward, draft_s, verify_s,
                                          proposal.draft_s))
                if on_tokens is not None and emitted:
                    on_tokens(output[before:])
        finally:
            committed = list(prompt_ids) + output
            self.coordinator.finish(request_id, committed[sent:], feedback)
        text = self.target.decode(output)
        cuts = [cut for cut in (text.find(stop) for stop in sampling.stop) if cut >= 0]
        if cuts:
            text, finish = text[: min(cuts)], "stop"
            while output and any(stop in self.target.decode(output[:-1]) for stop in sampling.stop):
                output.pop()  # token ids end with the token that completed the stop string
        return GenerationResult(text, output, finish, len(prompt_ids), rounds)

    def _emit(self, output: list[int], new_tokens: Sequence[int], sampling: SamplingParams) -> tuple[int, str | None]:
        """Append a round's tokens to the output, honouring EOS, max_tokens and stop strings."""
        before = len(output)
        for token in new_tokens:
            if token in self.target.eos_ids:
                return len(output) - before, "stop"
            output.append(token)
            if len(output) >= sampling.max_tokens:
                return len(output) - before, "length"
        if sampling.stop:
            tail = self.target.decode(output[-(len(new_tokens) + 16) :])
            if any(stop in tail for stop in sampling.stop):
                return len(output) - before, "stop"
        return len(output) - before, None
