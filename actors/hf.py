"""Model drafter: a small causal LM that shares the target's tokenizer.

Keeps its own KV cache per request. On each call it crops the cache to the longest common prefix
of what it has cached (including its own rejected drafts) and the committed context, prefills only
the rest, then drafts k tokens one forward at a time. Greedy drafting takes the argmax and sends
its temperature-1 distribution (top `q_top_n`, for the BD reward); sampled drafting draws from
the top `q_top_n` of its warped distribution, renormalised, and sends exactly that q, so
verification stays lossless. With `min_confidence` > 0 the draft ends after a token the drafter
gave less than that probability (as transformers' assistant confidence threshold): the tokens it
would likely lose are neither drafted nor verified. A drafter whose vocabulary differs from the
target's is refused.

Drafting ahead (`draft_ahead` = n > 0, set by whoever knows the device's timings): after a draft,
the drafter goes on drafting n more tokens along its own path, as a drafter on its own device
does while the target verifies. The path is kept; when the next call's committed context is
that path's beginning (its draft accepted and the target's next token its own guess), the rest of
the path is its next draft, already drafted: only the tokens drafted beyond it count in `draft_s`
(`ready` says beforehand how many there are). In one process the ahead tokens are drafted after
the timed draft, outside `draft_s` (`ahead_s`); a drafter actor on its own device drafts them in
the background instead (`in_background`; `extend_ahead` after the call returns, interrupted
between tokens when the next call comes).
"""
from __future__ import annotations

import secrets
import threading
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from actors.kv_cache import common_prefix_length, crop_cache
from actors.proposal import Proposal, SparseDist
from actors.session import SessionStore
from deploy.errors import InvalidRequestError
from deploy.sampling import SamplingParams, warp_probs


@dataclass(frozen=True)
class _PathToken:
    token: int
    q: SparseDist
    confidence: float  # the drafter's probability of the token (the min_confidence rule)


@dataclass
class _DraftState:
    cache: object  # transformers DynamicCache
    cached: list[int] = field(default_factory=list)  # tokens whose K/V are in `cache`
    generator: torch.Generator | None = None
    sampling: SamplingParams | None = None  # the request's, for drafting ahead
    path_from: int = 0  # context length the path continues
    path: list[_PathToken] = field(default_factory=list)  # its last draft and what it drafted ahead of it

    def follow(self, context: Sequence[int]) -> None:
        """Keep the part of the path beyond `context` when the context took the path's way so far
        (its committed tokens beyond path_from are the path's first ones); else drop it."""
        walked = len(context) - self.path_from
        if 0 <= walked <= len(self.path) and all(context[self.path_from + i] == self.path[i].token for i in range(walked)):
            del self.path[:walked]
        else:
            self.path = []
        self.path_from = len(context)


def sparse_top(probs: torch.Tensor, top_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """probs: [V] -> (ids [n], renormalised probs [n]) of the top_n non-zero entries."""
    values, ids = torch.topk(probs, min(top_n, probs.shape[-1]))
    keep = values > 0
    values, ids = values[keep], ids[keep]
    return ids, values / values.sum()


class HFModelProposer:
    model_free = False

    def __init__(self, model: torch.nn.Module, name: str = "hf", target_vocab_size: int | None = None, q_top_n: int = 64,
                 min_confidence: float = 0.0) -> None:
        vocab = int(model.get_output_embeddings().weight.shape[0])
        if target_vocab_size is not None and vocab != target_vocab_size:
            raise InvalidRequestError(
                "drafters",
                f"drafter {name!r} has a vocabulary of {vocab} tokens but the target has {target_vocab_size}; "
                "an hf drafter must share the target's tokenizer",
            )
        self.name, self.model, self.q_top_n, self.min_confidence = name, model, q_top_n, min_confidence
        self.draft_ahead = 0  # tokens to draft beyond each draft (module docstring)
        self.in_background = False  # draft ahead in extend_ahead (a background thread), not in propose
        self._drafting = threading.Lock()  # one of propose / extend_ahead at a time
        self._interrupt = threading.Event()  # a propose call is waiting: extend_ahead stops
        self.device = next(model.parameters()).device
        self.sessions = SessionStore()

    def _forward(self, state: _DraftState, token_ids: Sequence[int]) -> torch.Tensor:
        """Append tokens to the drafter's cache. -> logits of the last position [V]."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)  # [1, n]
        out = self.model(input_ids=ids, past_key_values=state.cache, use_cache=True, logits_to_keep=1)
        state.cached.extend(token_ids)
        return out.logits[0, -1].float().cpu()

    def _new_state(self) -> _DraftState:
        from transformers import DynamicCache

        return _DraftState(cache=DynamicCache(config=self.model.config))

    def set_draft_ahead(self, tokens: int, in_background: bool = False) -> None:
        self.draft_ahead, self.in_background = max(0, int(tokens)), in_background

    def ready(self, session: str, context_delta: Sequence[int] = ()) -> int:
        """Tokens of its next draft already drafted for this context (drafted ahead), without drafting."""
        entry = self.sessions.get(session)
        if entry is None or entry.state is None or not entry.state.path:
            return 0
        state = entry.state
        context = [*entry.tokens, *context_delta]
        walked = len(context) - state.path_from
        if not 0 <= walked < len(state.path):
            return 0
        if any(context[state.path_from + i] != state.path[i].token for i in range(walked)):
            return 0
        return len(state.path) - walked

    @torch.inference_mode()
    def extend_ahead(self, session: str) -> None:
        """Draft ahead along the session's path after its last draft, until a propose call comes."""
        with self._drafting:
            entry = self.sessions.get(session)
            state = entry.state if entry is not None else None
            if state is None or state.sampling is None or not self.draft_ahead or self._interrupt.is_set():
                return
            self._extend(state, entry.tokens, len(state.path) + self.draft_ahead, state.sampling, stop=self._interrupt.is_set)

    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        self._interrupt.set()
        with self._drafting:
            self._interrupt.clear()
            return self._propose(session, context_delta, k, sampling, wait=True)

    def offer(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams) -> Proposal:
        """What it drafted ahead for this context (at most k tokens; none drafted now), then it
        drafts ahead from here: a drafter not chosen keeps up with the request for free."""
        self._interrupt.set()
        with self._drafting:
            self._interrupt.clear()
            return self._propose(session, context_delta, k, sampling, wait=False)

    @torch.inference_mode()
    def _propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams,
                 wait: bool) -> Proposal:
        start = time.perf_counter()
        entry = self.sessions.extend(session, context_delta, new_state=self._new_state)
        tokens, state = entry.tokens, entry.state
        if not tokens or k <= 0:
            return Proposal(drafter=self.name)
        if state.generator is None and not sampling.greedy:
            seed = secrets.randbits(62) if sampling.seed is None else (sampling.seed ^ zlib.crc32(self.name.encode()))
            state.generator = torch.Generator().manual_seed(seed)
        state.sampling = sampling
        state.follow(tokens)  # what it drafted ahead for this context, if anything
        ready = len(state.path)
        if wait:
            self._extend(state, tokens, k, sampling, draft_only=True)
        draft = state.path[: self._draft_length(state.path, k)]
        drafted = time.perf_counter()  # tokens drafted ahead cost nothing now
        ahead_s = 0.0
        if self.draft_ahead and not self.in_background:
            self._extend(state, tokens, len(draft) + self.draft_ahead, sampling)
            ahead_s = time.perf_counter() - drafted
        return Proposal(self.name, tuple(t.token for t in draft), tuple(t.q for t in draft), drafted - start,
                        ready=min(ready, len(draft)), ahead_s=ahead_s)

    def _draft_length(self, path: Sequence[_PathToken], k: int) -> int:
        """A draft is the path's first k tokens, ending after the first unsure one."""
        for i, step in enumerate(path[:k]):
            if step.confidence < self.min_confidence:
                return i + 1
        return min(k, len(path))

    def _holds(self, path: Sequence[_PathToken], length: int, draft_only: bool) -> bool:
        return len(path) >= length or (draft_only and any(t.confidence < self.min_confidence for t in path[:length]))

    def _extend(self, state: _DraftState, context: Sequence[int], length: int, sampling: SamplingParams,
                draft_only: bool = False, stop=None) -> None:
        """Draft along the path until it holds `length` tokens (draft_only: or an unsure one, where a
        draft ends; stop(): or until it says so)."""
        if self._holds(state.path, length, draft_only):
            return
        prefix = [*context, *(t.token for t in state.path)]
        keep = min(common_prefix_length(state.cached, prefix), len(prefix) - 1)
        crop_cache(state.cache, keep)
        del state.cached[keep:]
        logits = self._forward(state, prefix[keep:])
        while True:
            probs = warp_probs(logits, sampling)  # [V]; temperature 1 under greedy
            ids, q_probs = sparse_top(probs, self.q_top_n)
            if sampling.greedy:
                token = int(torch.argmax(logits))
            else:
                token = int(ids[torch.multinomial(q_probs, 1, generator=state.generator)])
            state.path.append(_PathToken(token, SparseDist(tuple(ids.tolist()), tuple(q_probs.tolist())), float(probs[token])))
            if self._holds(state.path, length, draft_only) or (stop is not None and stop()):
                return
            logits = self._forward(state, [token])

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
