"""A request in the engine: its state from round to round (`RequestState`), each round's trace
(`RoundTrace`) and what the caller gets back (`GenerationResult`)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from actors.sampling import SamplingParams
from deploy.engine.counterfactual import CounterfactualScorer
from deploy.engine.logprobs import TokenLogprob
from deploy.engine.slot_kv import SlotSequence
from policy.coordinator import RoundFeedback

ABORT = "abort"  # the finish reason of a request whose caller left (vLLM's name)


@dataclass(frozen=True)
class RoundTrace:
    drafter: str  # several drafters of one round joined by '+'
    drafted: int  # positions verified (a tree's distinct nodes)
    accepted: int
    emitted: int
    reward: float
    draft_s: float  # the coordinator call as the target saw it (selection, RPCs, drafting)
    verify_s: float
    drafter_s: float = 0.0  # the slowest drafter's own drafting time (chosen and shadow drafts; on the engine's device)
    drafting_sum_s: float = 0.0  # every drafter's own drafting time as measured here, summed

    @property
    def parallel_draft_s(self) -> float:
        """The coordinator call had its drafters drafted in parallel, as drafter actors on their
        own devices do: its overhead (selection, RPCs, merging) plus the slowest drafter. Equal to
        draft_s for one drafter; in-process drafting pays their sum."""
        return max(0.0, self.draft_s - self.drafting_sum_s) + self.drafter_s


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort" (the caller left: `run(abandoned=...)`)
    prompt_tokens: int
    rounds: list[RoundTrace] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # per token of token_ids, when the request asked (sampling.logprobs)

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


@dataclass
class RequestState:
    """One request in flight: what the loop carries from round to round."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    generator: torch.Generator
    cache: SlotSequence
    shadows: CounterfactualScorer
    cutting: bool  # cut drafts (and choose among them) by the measured costs
    tokens: list[int] = field(default_factory=list)  # committed context; the cache covers tokens[:-1]
    sent: int = 0  # committed tokens the coordinator has seen
    output: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)  # per output token, when sampling.logprobs is set
    rounds: list[RoundTrace] = field(default_factory=list)
    feedback: RoundFeedback | None = None  # rides on the next coordinator call
    finish: str | None = None
    features: list[torch.Tensor] | None = None  # the target's features not yet sent (None: not collected)
    predictions: list | None = None  # the target's top-k predictions not yet sent (deploy/engine/predictions.py; None: not collected)
    hidden_sum: torch.Tensor | None = None  # the prompt's last hidden states summed over its prefilled positions
    hidden_positions: int = 0

    @property
    def context(self) -> torch.Tensor | None:
        """The prompt's context for the coordinator: the mean of the target's last hidden states over
        the prefilled prompt ([H]; None before a prefill, or for a one-token prompt)."""
        return None if self.hidden_sum is None else self.hidden_sum / self.hidden_positions

    def sum_hidden(self, hidden_sum: torch.Tensor | None, positions: int) -> None:
        """Add a prefilled chunk's summed last hidden states."""
        if hidden_sum is not None:
            self.hidden_sum = hidden_sum if self.hidden_sum is None else self.hidden_sum + hidden_sum
            self.hidden_positions += positions
