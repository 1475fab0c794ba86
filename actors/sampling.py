"""Sampling parameters and the ONE function that turns logits into the distribution sampled from.

`warp_probs` applies temperature, top-k and top-p (in that order, as HF and vLLM do) and is used
for both the target's p and every drafter's q, which is what keeps speculative sampling lossless.
`SamplingParams` validates itself on construction and raises `InvalidRequestError` naming the field.
Bounds: a temperature below `GREEDY_BELOW` (1e-5, as vLLM) decodes greedily (dividing logits by it
would overflow); `seed` fits torch's generator (-2^63 .. 2^64-1); at most `MAX_STOP` stop strings
of at most `MAX_STOP_CHARS` characters (they are re-scanned every round).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from actors.errors import InvalidRequestError

MAX_TOP_LOGPROBS = 20  # OpenAI's bound on top_logprobs
GREEDY_BELOW = 1e-5  # temperatures under this decode greedily
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
MAX_STOP, MAX_STOP_CHARS = 16, 256


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters. temperature 0 (or below GREEDY_BELOW) means greedy."""

    max_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = no top-k cut
    seed: int | None = None
    stop: tuple[str, ...] = field(default=())
    logprobs: int | None = None  # None: none; n >= 0: each emitted token's log-probability and the n most likely
    cache_salt: str | None = None  # isolates cross-request drafter caches (the suffix cache) per tenant

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or self.max_tokens <= 0:
            raise InvalidRequestError("max_tokens", f"must be a positive integer, got {self.max_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise InvalidRequestError("temperature", f"must be a number >= 0, got {self.temperature!r}")
        if math.isinf(self.temperature):
            raise InvalidRequestError("temperature", "must be finite")
        if not isinstance(self.top_p, (int, float)) or math.isnan(self.top_p) or not 0 < self.top_p <= 1:
            raise InvalidRequestError("top_p", f"must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidRequestError("top_k", f"must be an integer >= 0 (0 = off), got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise InvalidRequestError("seed", f"must be an integer, got {self.seed!r}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise InvalidRequestError("seed", f"must be in [-2^63, 2^64 - 1], got {self.seed}")
        if self.logprobs is not None and (isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int)
                                          or not 0 <= self.logprobs <= MAX_TOP_LOGPROBS):
            raise InvalidRequestError("top_logprobs", f"must be an integer in 0..{MAX_TOP_LOGPROBS}, got {self.logprobs!r}")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidRequestError("stop", "must be non-empty strings")
        if len(stop) > MAX_STOP or any(len(s) > MAX_STOP_CHARS for s in stop):
            raise InvalidRequestError("stop", f"at most {MAX_STOP} stop strings of at most {MAX_STOP_CHARS} characters")
        object.__setattr__(self, "stop", stop)

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def seeded_sampling(self) -> bool:
        """Sampled with a seed: the output must depend on the seed alone, never on what the engine
        learned (its drafts are verified whole, as the chosen drafter drafted them)."""
        return not self.greedy and self.seed is not None


def warp_probs(logits: torch.Tensor, sampling: SamplingParams) -> torch.Tensor:
    """Probabilities to sample from. logits: [..., V] -> probs: [..., V] (float32, rows sum to 1).

    Greedy requests use temperature 1 here (the distributions the BD reward compares).
    """
    logits = logits.float()
    if not sampling.greedy:
        logits = logits / sampling.temperature
    vocab = logits.shape[-1]
    if 0 < sampling.top_k < vocab:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= sampling.top_p
        drop_sorted[..., 0] = False  # the top token stays (a top_p below float32's range compares as 0)
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return torch.softmax(logits, dim=-1)
