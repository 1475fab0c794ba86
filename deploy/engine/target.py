"""The target model: prompt encoding (raw text, chat messages, token ids) and KV-cached forwards.

`forward(cache, token_ids)` appends positions to a per-request DynamicCache and returns the logits
of every new position ([n, V], float32 on CPU); `crop` (actors/kv_cache.py) rolls rejected
positions back. `forward(..., parents=)` runs a token tree instead of a chain (several drafts in
one pass; deploy/engine/draft_tree.py): each new position attends to the prefix, its ancestors and
itself, at the position id of its depth; `keep` then moves the accepted branch's K/V into place.
`forward_batch(kv, rows)` is the engine's forward: many requests' new positions (chains or trees)
in one pass on a slot KV store (deploy/engine/slot_kv.py), each row's logits returned apart;
`batch_profile` times it by its packed positions (goodput control, deploy/engine/goodput.py);
`cost_profile` / `adopt_cost_profile` hand what was timed to a replica on like hardware.
Input problems raise InvalidRequestError naming the field.
"""
from __future__ import annotations

import inspect
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from actors.eagle_head import feature_layers
from actors.errors import InvalidRequestError
from actors.kv_cache import crop_cache
from actors.models import LoadedModel
from deploy.engine.chat_messages import normalize_messages, template_knows_tools
from deploy.engine.draft_tree import attention_allowed, depths_of
from deploy.engine.slot_kv import RowSpec, SlotKV, SlotSequence, install_slot_attention


@dataclass
class BatchRow:
    """One request's part of a batched forward: `token_ids` appended to its slot `cache`, logits
    for the first `logits_for` of them (None: all), a token tree when `parents` is given; its
    positions' features after a forward that asked for them; with `summed`, the sum of its positions'
    last hidden states (a prompt's context: deploy/engine/request.py `RequestState.context`)."""

    cache: SlotSequence
    token_ids: Sequence[int]
    logits_for: int | None = None
    parents: Sequence[int] | None = None
    features: torch.Tensor | None = field(default=None, compare=False)  # set by forward_batch(features=True)
    summed: bool = False  # set `hidden_sum`
    hidden_sum: torch.Tensor | None = field(default=None, compare=False)  # [H] float32, CPU


class TargetModel:
    def __init__(self, loaded: LoadedModel) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.device = loaded.device
        self.vocab_size = loaded.vocab_size
        self.context_length = int(getattr(self.model.config, "max_position_embeddings", 2048))
        eos = getattr(self.model.generation_config, "eos_token_id", None)
        eos_ids = set(eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])
        if self.tokenizer.eos_token_id is not None:
            eos_ids.add(self.tokenizer.eos_token_id)
        self.eos_ids = frozenset(int(e) for e in eos_ids)
        self._profile: list[float] = []  # forward_profile cache
        self._batch_profiles: dict[tuple, list[float]] = {}  # batch_profile cache
        self._slices_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._slotted = False  # slot attention installed (on the first batched forward)
        self.feature_layers = feature_layers(int(self.model.config.num_hidden_layers))  # what an eagle head reads

    @property
    def name(self) -> str:
        return self.loaded.name

    def encode(
        self,
        prompt: str | None = None,
        messages: Sequence[dict] | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> list[int]:
        given = [x is not None for x in (prompt, messages, token_ids)]
        if sum(given) != 1:
            raise InvalidRequestError("prompt", "give exactly one of prompt, messages or token_ids")
        if prompt is not None:
            if not isinstance(prompt, str) or not prompt:
                raise InvalidRequestError("prompt", "must be a non-empty string")
            ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        elif messages is not None:
            ids = self._encode_chat(messages)
        else:
            if not isinstance(token_ids, (list, tuple)) or not token_ids:
                raise InvalidRequestError("token_ids", "must be a non-empty list of token ids")
            if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size for t in token_ids):
                raise InvalidRequestError("token_ids", f"every id must be an integer in [0, {self.vocab_size})")
            ids = list(token_ids)
        if not ids:
            raise InvalidRequestError("prompt", "encodes to no tokens")
        return list(ids)

    def _encode_chat(self, messages: Sequence[dict]) -> list[int]:
        """OpenAI-style messages (deploy/engine/chat_messages.py) through the model's chat template."""
        template = getattr(self.tokenizer, "chat_template", None)
        rendered = normalize_messages(messages, template_knows_tools(template if isinstance(template, str) else None))
        text = self.tokenizer.apply_chat_template(rendered, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def check_length(self, prompt_tokens: int, max_tokens: int) -> None:
        if prompt_tokens >= self.context_length:
            raise InvalidRequestError("prompt", f"is {prompt_tokens} tokens; the context holds {self.context_length}")
        if prompt_tokens + max_tokens > self.context_length:
            raise InvalidRequestError(
                "max_tokens",
                f"{max_tokens} + {prompt_tokens} prompt tokens exceeds the context of {self.context_length}",
            )

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def new_cache(self) -> object:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def forward(
        self, cache: object, token_ids: Sequence[int], logits_for: int | None = None, parents: Sequence[int] | None = None
    ) -> torch.Tensor:
        """Append token_ids to the cache. -> logits [n, V] of each new position, or of the first
        `logits_for` only (the vocabulary projection is skipped for the rest: a prefill needs none,
        a padded verification needs the draft's). `parents` (per new position, its parent's index
        among them, -1 = follows the cached prefix) makes the new positions a tree, not a chain."""
        ids = torch.tensor([list(token_ids)], dtype=torch.long, device=self.device)  # [1, n]
        extra = {}
        if logits_for is not None and logits_for < len(token_ids) and self._slices_logits:
            extra["logits_to_keep"] = torch.arange(max(logits_for, 1), device=self.device)
        if parents is not None:
            prefix = cache.get_seq_length()
            allowed = attention_allowed(parents, prefix).to(self.device)  # [n, prefix + n]
            mask = torch.zeros(allowed.shape, dtype=self.model.dtype, device=self.device)
            extra["attention_mask"] = mask.masked_fill(~allowed, torch.finfo(mask.dtype).min)[None, None]
            extra["position_ids"] = torch.tensor([[prefix + d for d in depths_of(parents)]], device=self.device)
        logits = self.model(input_ids=ids, past_key_values=cache, use_cache=True, **extra).logits[0]
        return logits[: len(token_ids) if logits_for is None else logits_for].float().cpu()

    def new_kv(self) -> SlotKV:
        return SlotKV.for_model(self.model)

    @torch.inference_mode()
    def forward_batch(self, kv: SlotKV, rows: Sequence[BatchRow], features: bool = False) -> list[torch.Tensor]:
        """One forward over every row's new positions, packed into one sequence (no padding in the
        linear layers); each attends to its own request's cache and its own earlier (or ancestor)
        new positions only (deploy/engine/slot_kv.py). -> per row, the logits [logits_for, V]
        (float32, CPU). `features`: also set each row's `features`, the hidden states entering the
        feature layers (actors/eagle_head.feature_layers: a low, a middle and a high layer),
        concatenated, of each of its new positions ([n, 3H], float16, CPU: what an EAGLE-3 head
        drafts from, actors/eagle.py)."""
        if not self._slotted:
            install_slot_attention(self.model)
            self._slotted = True
        for row in rows:
            kv.reserve(row.cache, row.cache.length + len(row.token_ids))
        batch = kv.plan([RowSpec(row.cache, len(row.token_ids), row.parents) for row in rows])
        ids: list[int] = []
        positions: list[int] = []
        logit_rows: list[int] = []
        for row in rows:
            n, prefix, start = len(row.token_ids), row.cache.length, len(ids)
            depths = range(n) if row.parents is None else depths_of(row.parents)
            ids += row.token_ids
            positions += [prefix + d for d in depths]
            logit_rows += range(start, start + (n if row.logits_for is None else row.logits_for))
        kv.begin(batch)
        try:  # the causal LM's forward, split so that the hidden states are at hand
            hidden = self.model.model(
                input_ids=torch.tensor([ids], device=self.device), past_key_values=kv, use_cache=True,
                attention_mask=batch.calls[0].mask, position_ids=torch.tensor([positions], device=self.device),
                slots=batch, output_hidden_states=features,
            )  # a 4-D attention_mask passes transformers' mask building by (slot_attention reads the calls')
        finally:
            kv.end()
        fused = self.fused_features(hidden)[0].to(torch.float16).cpu() if features else None  # [T, 3H]
        hidden = hidden.last_hidden_state[0]  # [T, H]
        logits = self.model.get_output_embeddings()(hidden[torch.tensor(logit_rows or [0], device=self.device)])
        logits = logits.float().cpu()
        out, taken, start = [], 0, 0
        for row in rows:
            n = len(row.token_ids)
            row.cache.length += n
            wanted = n if row.logits_for is None else row.logits_for
            out.append(logits[taken : taken + wanted])
            if fused is not None:
                row.features = fused[start : start + n]
            if row.summed:
                row.hidden_sum = hidden[start : start + n].sum(dim=0).float().cpu()
            taken, start = taken + wanted, start + n
        return out

    def fused_features(self, outputs: object) -> torch.Tensor:
        """A base-model forward's outputs (run with output_hidden_states) -> the hidden states entering
        the feature layers, concatenated [B, T, 3H]."""
        return torch.cat([outputs.hidden_states[i] for i in self.feature_layers], dim=-1)

    def crop(self, cache: object, length: int) -> None:
        crop_cache(cache, length)

    @torch.inference_mode()
    def keep(self, cache: object, start: int, positions: Sequence[int]) -> None:
        """Keep cache positions [0, start) plus `positions` (absolute, ascending, each >= start)
        moved to start, start + 1, ...; drop the rest (a tree's accepted branch)."""
        if list(positions) != list(range(start, start + len(positions))):
            source = torch.tensor(list(positions), device=self.device)
            for layer in cache.layers:
                layer.keys[:, :, start : start + len(positions)] = layer.keys.index_select(2, source)
                layer.values[:, :, start : start + len(positions)] = layer.values.index_select(2, source)
        crop_cache(cache, start + len(positions))

    def forward_profile(self, max_positions: int, context: int = 128, repeats: int = 4) -> list[float]:
        """Seconds of a verification forward over 1..max_positions new positions, logits for each
        of them (index 0 = 1 position): the fastest of `repeats` (other work on the machine only
        adds time, and a size that looks cheaper than it is gets used and re-timed by the engine).

        Measured once per target and size on a `context`-token cache (each size warmed up first),
        through `forward_batch` with one request (the engine's forward), and cached. On CPU the
        cost is far from monotonic in the positions and, more so, in the vocabulary projection's
        rows (MKL picks different kernels: here 2 or 3 rows cost more than 4, 7 more than 8), which
        `padded_length` exploits: a padded forward keeps every row's logits.
        """
        missing = list(range(len(self._profile) + 1, max_positions + 1))
        if missing:
            self._profile.extend(self.batch_profile(missing, rows=1, context=context, repeats=repeats))
        return self._profile[:max_positions]

    def batch_profile(self, sizes: Sequence[int], rows: int = 32, context: int = 64, repeats: int = 3) -> list[float]:
        """Seconds of a batched forward (`forward_batch`) over each of `sizes` packed positions,
        spread over min(size, rows) requests of `context` cached tokens each, logits for every
        position: the fastest of `repeats`, after a warm-up. Measured once per target and sizes,
        and cached."""
        key = (tuple(sizes), rows, context)
        if key not in self._batch_profiles:
            kv = self.new_kv()
            caches = [SlotSequence() for _ in range(rows)]
            self.forward_batch(kv, [BatchRow(c, [(7 * i + j) % self.vocab_size for j in range(context)], logits_for=0)
                                    for i, c in enumerate(caches)])
            times = {size: [] for size in sizes}
            for round_index in range(repeats + 1):
                for size in sizes:
                    used = caches[: min(size, rows)]
                    shares = [size // len(used) + (i < size % len(used)) for i in range(len(used))]
                    start = time.perf_counter()
                    self.forward_batch(kv, [BatchRow(c, list(range(1, n + 1))) for c, n in zip(used, shares)])
                    if round_index:  # round 0 only warms each size up
                        times[size].append(time.perf_counter() - start)
                    for c in used:
                        kv.crop(c, context)
            self._batch_profiles[key] = [min(times[size]) for size in sizes]
        return self._batch_profiles[key]

    def cost_profile(self) -> dict:
        """What `forward_profile` and `batch_profile` measured so far, as JSON-ready lists (for
        replicas on like hardware: deploy/engine/shared_profile.py)."""
        return {"forward": list(self._profile),
                "batch": [{"sizes": list(sizes), "rows": rows, "context": context, "seconds": list(seconds)}
                          for (sizes, rows, context), seconds in self._batch_profiles.items()]}

    def adopt_cost_profile(self, profile: dict) -> None:
        """Take another replica's `cost_profile` as if measured here (what is already measured stays)."""
        forward = [float(s) for s in profile.get("forward", [])]
        if len(forward) > len(self._profile):
            self._profile = self._profile + forward[len(self._profile):]
        for entry in profile.get("batch", []):
            key = (tuple(int(n) for n in entry["sizes"]), int(entry["rows"]), int(entry["context"]))
            if len(entry["seconds"]) == len(key[0]):
                self._batch_profiles.setdefault(key, [float(s) for s in entry["seconds"]])

    def plain_step_s(self) -> float:
        """Seconds of one plain decoding step (a one-position forward)."""
        return self.forward_profile(1)[0]

    def padded_length(self, positions: int, max_positions: int) -> int:
        """The cheapest forward size >= positions (ties go to the smaller); 1 is never padded."""
        if positions <= 1 or positions >= max_positions:
            return positions
        profile = self.forward_profile(max_positions)
        return min(range(positions, max_positions + 1), key=lambda m: (profile[m - 1] * 1.03 ** (m - positions), m))
