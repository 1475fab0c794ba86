"""A compact forward for a small Llama-style drafter on CPU: what makes a drafted token cheap.

`CompactLM.from_model(lm, head_weight, head_ids)` takes a transformers Llama-style causal LM's
decoder layers (a distilled drafter's few layers, actors/distilled.py) and a head, and keeps them as
a one-token step wants them: the query/key/value and the gate/up projections fused, every
projection and the head as per-row int8 weights with bfloat16 scales (`torch._weight_int8pack_mm`,
bfloat16 activations: a one-row product reads a quarter of float32's bytes), the rotary angles as a
table. A session's keys and values live in a `CompactCache`: preallocated, grown by a step,
cropped by length (what actors/kv_cache.crop_cache asks of a cache).

Calling it (`model(input_ids, past_key_values=cache)`, as a transformers model is called) appends
the tokens and returns the logits of the last position over the head's tokens ([1, 1, V'] float32;
`vocabulary` maps them to token ids). Appends of 1 to COMPILED_TOKENS tokens (a drafted token, a
round's catch-up) go through `torch.compile`d graphs, one per token count and layer shape (the
head's product runs apart, so drafters of one architecture share them), the
cache's length a dynamic dimension (growing it does not recompile), so a layer's ~25 small
operations run as a few fused kernels; attention is two batched products per key/value head over
the whole buffer, each token masked past its position. Longer appends, and every append where
compiling fails, run the same step eagerly. `for_drafting` builds it for a drafter on CPU and
compiles it at load. The int8 weights change the logits slightly (top-1 agreement with the float32
drafter in docs/experiments.md); drafts are only proposals, so the target's output is unchanged.
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass

import torch

logger = logging.getLogger("specfleet")

MIN_CAPACITY = 256  # positions a session's cache starts with
COMPILED_TOKENS = 3  # appends of up to this many tokens (a draft step, a round's catch-up) run compiled
RECOMPILE_LIMIT = 64  # graphs of the compiled step (one per token count and layer shape) before torch stops
CAPACITY_STEP = 128  # ... and grows by when full (attention reads the whole buffer: little slack)


def _sized(buffer: torch.Tensor) -> torch.Tensor:
    """A cache buffer whose length the compiled step takes as a variable (one graph for any length)."""
    torch._dynamo.mark_dynamic(buffer, 1)
    return buffer


@dataclass
class _Output:
    logits: torch.Tensor  # [1, 1, V'] over the head's tokens


@dataclass(frozen=True)
class _Int8:
    weight: torch.Tensor  # [out, in] int8
    scale: torch.Tensor  # [out] bfloat16


def for_drafting(model: torch.nn.Module) -> torch.nn.Module | CompactLM:
    """A small drafter as it drafts: on CPU its compact step, compiled here (a distilled drafter's
    reduced head, actors/distilled.ReducedHeadLM, or a Llama-style causal LM's own head); on a GPU,
    or for a model the step does not cover, the model as it is."""
    if next(model.parameters()).device.type != "cpu":
        return model
    try:
        if hasattr(model, "head_ids"):  # a distilled drafter
            compact = CompactLM.from_model(model.base, model.head.weight, model.head_ids)
        else:
            compact = CompactLM.from_model(model, model.get_output_embeddings().weight, None)
        compact.warm_up()  # also fails here where this torch lacks the int8 product
    except (AttributeError, RuntimeError, ValueError) as err:
        logger.warning("%s drafts through transformers: %s", type(model).__name__, err)
        return model
    return compact


def quantize_rows(weight: torch.Tensor) -> _Int8:
    """Per-row symmetric int8: weight ~= int8 * scale (scale = the row's largest magnitude / 127)."""
    weight = weight.detach().float()
    scale = (weight.abs().amax(dim=1) / 127).clamp_min(1e-8)
    return _Int8((weight / scale[:, None]).round().clamp(-127, 127).to(torch.int8).contiguous(), scale.to(torch.bfloat16))


def linear(x: torch.Tensor, w: _Int8) -> torch.Tensor:
    """x [n, in] float32 @ the int8 weight -> [n, out] float32."""
    return torch._weight_int8pack_mm(x.to(torch.bfloat16), w.weight, w.scale).float()


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding (Llama's half-split form); x [..., hd], cos/sin broadcastable."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


@dataclass(frozen=True)
class _Layer:
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    qkv: _Int8
    o: _Int8
    gate_up: _Int8
    down: _Int8


class CompactCache:
    """One session's keys and values: per layer [kv heads, capacity, head dim], the first `length` valid."""

    @torch.inference_mode()  # every tensor the compiled step sees is an inference tensor (one set of guards)
    def __init__(self, layers: int, kv_heads: int, head_dim: int, capacity: int = MIN_CAPACITY) -> None:
        self.keys = [_sized(torch.zeros(kv_heads, capacity, head_dim)) for _ in range(layers)]
        self.values = [_sized(torch.zeros(kv_heads, capacity, head_dim)) for _ in range(layers)]
        self.length = 0

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[1]

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (a negative length drops that many from the end)."""
        self.length = max(0, self.length + length if length < 0 else min(length, self.length))

    def reserve(self, length: int) -> None:
        """Room for `length` positions (the buffers double until they fit)."""
        capacity = self.capacity
        while capacity < length:
            capacity += CAPACITY_STEP
        if capacity != self.capacity:
            grow = lambda t: _sized(torch.cat([t, t.new_zeros(t.shape[0], capacity - t.shape[1], t.shape[2])], dim=1))
            self.keys = [grow(t) for t in self.keys]
            self.values = [grow(t) for t in self.values]


class CompactLM:
    def __init__(self, embeddings: torch.Tensor, layers: list[_Layer], final_norm: torch.Tensor, head: _Int8,
                 vocabulary: torch.Tensor | None, heads: int, kv_heads: int, eps: float, rope_theta: float,
                 context_length: int, config: object = None) -> None:
        self.embeddings, self.layers, self.final_norm, self.head = embeddings, layers, final_norm, head
        self.vocabulary = vocabulary  # head index -> token id (None: the head covers the whole vocabulary)
        self.heads, self.kv_heads, self.eps = heads, kv_heads, eps
        self.hidden = int(embeddings.shape[1])
        self.head_dim = self.hidden // heads
        self.config = config
        self.device = torch.device("cpu")
        inverse = 1.0 / (rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        angles = torch.outer(torch.arange(context_length).float(), inverse)
        self.cos = torch.cat([angles.cos(), angles.cos()], dim=-1)  # [positions, hd]
        self.sin = torch.cat([angles.sin(), angles.sin()], dim=-1)
        self._compiled = None  # the one-token step, compiled on first use (False: compiling failed)

    @classmethod
    def from_model(cls, lm: torch.nn.Module, head_weight: torch.Tensor, head_ids: torch.Tensor | None) -> CompactLM:
        """From a transformers Llama-style causal LM (its decoder layers, embeddings and final norm)
        and a head ([V', H] over head_ids; None: over the whole vocabulary). Raises ValueError for a
        model this step does not reproduce (biases, scaled rotary, another activation)."""
        config = lm.config
        rope = getattr(config, "rope_parameters", None) or {}
        if rope.get("rope_type", "default") != "default" or getattr(config, "attention_bias", False) \
                or getattr(config, "mlp_bias", False) or getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError("the compact step covers Llama-style decoders with plain rotary, no biases, SiLU")
        layers = []
        for layer in lm.model.layers:
            attention, mlp = layer.self_attn, layer.mlp
            layers.append(_Layer(
                layer.input_layernorm.weight.detach().float(), layer.post_attention_layernorm.weight.detach().float(),
                quantize_rows(torch.cat([attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight])),
                quantize_rows(attention.o_proj.weight),
                quantize_rows(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                quantize_rows(mlp.down_proj.weight)))
        theta = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        return cls(lm.model.embed_tokens.weight.detach().float(), layers, lm.model.norm.weight.detach().float(),
                   quantize_rows(head_weight), None if head_ids is None else head_ids.to(torch.long),
                   int(config.num_attention_heads), int(config.num_key_value_heads), float(config.rms_norm_eps),
                   theta, int(getattr(config, "max_position_embeddings", 8192)), config)

    @property
    def vocab_size(self) -> int:
        """The vocabulary the head's tokens come from (the target's)."""
        return int(getattr(self.config, "vocab_size", 0)) or int(self.head.weight.shape[0])

    def new_cache(self) -> CompactCache:
        return CompactCache(len(self.layers), self.kv_heads, self.head_dim)

    def warm_up(self) -> None:
        """Compile the step for every token count now (seconds), not on a request's first draft."""
        for n in range(1, COMPILED_TOKENS + 1):
            self(torch.tensor([[0] * n]), self.new_cache())

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, past_key_values: CompactCache, use_cache: bool = True,
                 logits_to_keep: int = 1) -> _Output:
        """Append input_ids [1, n] to the cache. -> the last position's logits over the head [1, 1, V']."""
        ids = torch.tensor(input_ids.reshape(-1).tolist(), dtype=torch.long)  # an inference tensor, as the cache's
        cache, start = past_key_values, past_key_values.length
        if start + len(ids) > self.cos.shape[0]:
            raise ValueError(f"{start + len(ids)} positions exceed the drafter's {self.cos.shape[0]}")
        cache.reserve(start + len(ids))
        if len(ids) <= COMPILED_TOKENS:
            hidden = self._compiled_step(ids, start, cache)
        else:
            hidden = self._many(ids, start, cache)
        cache.length = start + len(ids)
        return _Output(linear(hidden, self.head).view(1, 1, -1))  # the head apart: one graph serves every drafter

    def _compiled_step(self, ids: torch.Tensor, position: int, cache: CompactCache) -> torch.Tensor:
        """A few tokens through the compiled step (compiled on first use for each count)."""
        if self._compiled is None:
            try:  # a graph per token count and layer shape: more than torch's default of 8 may be wanted
                compiled = compiled_step()
                out = compiled(*self._step_inputs(ids, position, cache))
                self._compiled = compiled
                return out
            except Exception as err:  # noqa: BLE001 - no compiler here: the same step, eagerly
                logger.warning("the compact drafter step did not compile (%s); it runs eagerly", err)
                self._compiled = False
        if self._compiled is False:
            return self._many(ids, position, cache)
        return self._compiled(*self._step_inputs(ids, position, cache))

    def _step_inputs(self, ids: torch.Tensor, position: int, cache: CompactCache) -> tuple:
        return (self.embeddings, self.layers, self.final_norm, self.cos, self.sin, self.heads,
                self.kv_heads, self.eps, ids, torch.arange(position, position + len(ids)), cache.keys, cache.values)

    def _many(self, ids: torch.Tensor, start: int, cache: CompactCache) -> torch.Tensor:
        """Tokens at positions start.. through the same step, eagerly (a long catch-up; no compiler)."""
        return _step(*self._step_inputs(ids, start, cache))


@functools.cache
def compiled_step() -> Callable:
    """`_step` compiled, one wrapper for the process (so every drafter's calls share its graphs)."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(_step, dynamic=False, fullgraph=True)


def _step(embeddings: torch.Tensor, layers: list[_Layer], final_norm: torch.Tensor, cos_table: torch.Tensor, sin_table: torch.Tensor, heads: int, kv_heads: int, eps: float,
          ids: torch.Tensor, positions: torch.Tensor, keys: list, values: list) -> torch.Tensor:
    """n tokens at `positions` ([n] each; n fixed per compiled graph, the cache length variable):
    attention over the whole buffer as two batched products per key/value head (no copies of the
    cache), each token masked past its own position. -> the last token's final hidden state [1, H]."""
    n, hidden = ids.shape[0], embeddings.shape[1]
    hd, group = hidden // heads, heads // kv_heads
    x = embeddings.index_select(0, ids)  # [n, H]
    cos, sin = cos_table.index_select(0, positions)[:, None], sin_table.index_select(0, positions)[:, None]  # [n, 1, hd]
    hidden_past = (torch.arange(keys[0].shape[1])[None, :] > positions[:, None]).repeat_interleave(group, dim=0)  # [n*group, cap]
    for index, layer in enumerate(layers):
        h = linear(rms_norm(x, layer.input_norm, eps), layer.qkv)
        q = rotate(h[:, :hidden].view(n, heads, hd), cos, sin)
        k = rotate(h[:, hidden : hidden + kv_heads * hd].view(n, kv_heads, hd), cos, sin)
        keys[index].index_copy_(1, positions, k.transpose(0, 1))
        values[index].index_copy_(1, positions, h[:, hidden + kv_heads * hd :].view(n, kv_heads, hd).transpose(0, 1))
        q = q.view(n, kv_heads, group, hd).transpose(0, 1).reshape(kv_heads, n * group, hd)
        scores = torch.bmm(q, keys[index].transpose(1, 2)) * hd**-0.5  # [kv, n*group, capacity]
        weights = torch.softmax(scores.masked_fill(hidden_past, float("-inf")), dim=-1)
        attended = torch.bmm(weights, values[index]).view(kv_heads, n, group, hd).transpose(0, 1).reshape(n, hidden)
        x = x + linear(attended, layer.o)
        gate_up = linear(rms_norm(x, layer.post_norm, eps), layer.gate_up)
        half = gate_up.shape[1] // 2
        x = x + linear(torch.nn.functional.silu(gate_up[:, :half]) * gate_up[:, half:], layer.down)
    return rms_norm(x[-1:], final_norm, eps)
