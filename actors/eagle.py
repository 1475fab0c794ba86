"""The `eagle` drafter: an EAGLE-style head (actors/eagle_head.py) drafting from the target's own features.

It is the one drafter that reads the target's hidden states (`needs_features = True`): each
`propose` call carries, beside the committed tokens it has not seen, the target's top-layer
features (post-norm last hidden states: an [m, H] tensor, or such chunks in order; any float
dtype) of the committed positions it has not seen. A session holds tokens x_0..x_{n-1} and features f_0..f_{n-2}: the target has
computed a feature for every committed token but the last, whose own forward is the next
verification. The head's KV cache holds the committed pairs (f_t, x_{t+1}); each call appends
the new ones in one forward, then drafts k tokens a one-position forward at a time, feeding its
predicted feature back. A session whose features do not line up with its tokens (it joined a
request whose earlier features it never received) drafts nothing. Greedy drafting takes the
head's argmax and sends its temperature-1 distribution (top `q_top_n`, for the BD reward);
sampled drafting draws from the top `q_top_n` of its warped distribution, renormalised, and sends
exactly that q, so verification stays lossless. Tokens outside the head's vocabulary are never
drafted.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from actors.eagle_head import EagleHead
from actors.hf import draft_position, drafting_generator
from actors.kv_cache import crop_cache
from actors.proposal import Proposal, SparseDist
from actors.sampling import SamplingParams
from actors.session import SessionStore


@dataclass
class _EagleState:
    cache: object  # transformers DynamicCache of the head's one layer
    features: list[torch.Tensor] = field(default_factory=list)  # chunks of f_0.. as received, [m, H]
    received: int = 0  # features received
    paired: int = 0  # committed pairs (f_t, x_{t+1}) in the cache
    last: torch.Tensor | None = None  # the head's output at the last committed pair [H]
    generator: torch.Generator | None = None


class EagleProposer:
    model_free = False
    needs_features = True

    def __init__(self, head: EagleHead, name: str = "eagle", q_top_n: int = 64) -> None:
        self.name, self.head, self.q_top_n = name, head, q_top_n
        self.device = next(head.parameters()).device
        self.sessions = SessionStore()

    def _new_state(self) -> _EagleState:
        from transformers import DynamicCache

        return _EagleState(cache=DynamicCache(config=self.head.config))

    def _step(self, state: _EagleState, token_ids: Sequence[int], features: torch.Tensor, first: int) -> torch.Tensor:
        """Append pairs (features[i], token_ids[i]) at positions first, first + 1, ... -> the head's
        output at the last of them [H]."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)
        positions = torch.arange(first, first + len(token_ids), device=self.device)[None]
        out = self.head.features(ids, features[None].to(self.device), past_key_values=state.cache, position_ids=positions)
        return out[0, -1]

    def _catch_up(self, state: _EagleState, tokens: Sequence[int]) -> bool:
        """Put every committed pair into the head's cache. -> False when the features do not line up."""
        if state.received != len(tokens) - 1 or not tokens or state.received == 0:
            return False
        crop_cache(state.cache, state.paired)  # the previous round's drafted pairs
        if state.paired < state.received:  # the chunks held are exactly the features not paired yet
            pending = torch.cat(state.features).float()
            state.last = self._step(state, tokens[state.paired + 1 : state.received + 1], pending, state.paired)
            state.features, state.paired = [], state.received
        return state.last is not None

    @torch.inference_mode()
    def propose(self, session: str, context_delta: Sequence[int], k: int, sampling: SamplingParams,
                features: torch.Tensor | Sequence[torch.Tensor] | None = None) -> Proposal:
        start = time.perf_counter()
        entry = self.sessions.extend(session, context_delta, new_state=self._new_state)
        state = entry.state
        for chunk in ([features] if isinstance(features, torch.Tensor) else features or ()):
            if len(chunk):
                state.features.append(chunk)
                state.received += len(chunk)
        if k <= 0 or not self._catch_up(state, entry.tokens):
            return Proposal(drafter=self.name, draft_s=time.perf_counter() - start)
        if state.generator is None and not sampling.greedy:
            state.generator = drafting_generator(sampling, self.name)
        feature, vocabulary = state.last, self.head.head_ids.cpu()
        draft: list[int] = []
        q: list[SparseDist] = []
        for j in range(k):
            logits = self.head.logits(feature).float().cpu()  # [V']
            token, dist, _ = draft_position(logits, sampling, state.generator, self.q_top_n, vocabulary)
            draft.append(token)
            q.append(dist)
            if j < k - 1:
                feature = self._step(state, [token], feature[None], state.paired + j)
        return Proposal(self.name, tuple(draft), tuple(q), time.perf_counter() - start)

    def release(self, session: str, context_delta: Sequence[int] = ()) -> None:
        self.sessions.pop(session)
