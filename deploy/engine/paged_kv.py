"""Paged KV for many requests in one target forward: one store per layer, each request's positions
in blocks of `BLOCK` slots (a block table, vLLM's layout).

`PagedKV` is what the target model's attention sees as its cache during a batched forward
(`TargetModel.forward_batch`): every request's new positions are packed into one row of tokens
(no padding), `update` writes their keys and values to the slots their requests own and returns
the store up to the highest slot in use, and a 4-D mask lets each new position attend to its own
request's cached positions and its ancestors among its new ones only. Blocks are handed out
lowest first, so the store that attention reads stays as short as the requests alive need; it
grows (doubling) when full. A request's cache is a `PagedSequence` (its block table and length):
`crop` rolls it back, `keep` moves a draft tree's accepted branch into place, `release` frees it.
Keys and values never move between blocks otherwise, so a request's slots stay valid while
others join and leave.
"""
from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

BLOCK = 16  # slots per block


@dataclass
class PagedSequence:
    """One request's cache: `length` positions held in `blocks` (slot = block * BLOCK + offset)."""

    blocks: list[int] = field(default_factory=list)
    length: int = 0


class PagedKV:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 blocks: int = 64) -> None:
        self.shape, self.dtype, self.device = (kv_heads, head_dim), dtype, device
        self.keys = [self._empty(blocks) for _ in range(num_layers)]
        self.values = [self._empty(blocks) for _ in range(num_layers)]
        self._free = list(range(blocks))  # a heap: the lowest free block first
        self._write: torch.Tensor | None = None  # during a forward: the slots of the new positions, packed
        self._read = 0  # during a forward: slots [0, _read) are what attention reads

    @classmethod
    def for_model(cls, model: torch.nn.Module, blocks: int = 64) -> "PagedKV":
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, model.dtype, next(model.parameters()).device, blocks)

    def _empty(self, blocks: int) -> torch.Tensor:
        return torch.zeros(1, self.shape[0], blocks * BLOCK, self.shape[1], dtype=self.dtype, device=self.device)

    @property
    def blocks(self) -> int:
        return self.keys[0].shape[2] // BLOCK

    @property
    def blocks_in_use(self) -> int:
        return self.blocks - len(self._free)

    def _grow(self) -> None:
        old = self.blocks
        for layers in (self.keys, self.values):
            for i, store in enumerate(layers):
                layers[i] = torch.cat([store, self._empty(old)], dim=2)
        for block in range(old, 2 * old):
            heapq.heappush(self._free, block)

    def reserve(self, sequence: PagedSequence, length: int) -> None:
        """Give `sequence` blocks for `length` positions."""
        while len(sequence.blocks) * BLOCK < length:
            if not self._free:
                self._grow()
            sequence.blocks.append(heapq.heappop(self._free))

    def slots(self, sequence: PagedSequence, start: int, stop: int) -> torch.Tensor:
        """The store slots of positions [start, stop) of `sequence` (reserved)."""
        return self.slots_of(sequence, torch.arange(start, stop))

    @staticmethod
    def slots_of(sequence: PagedSequence, positions: torch.Tensor) -> torch.Tensor:
        """The store slots of `positions` of `sequence` (reserved)."""
        table = torch.tensor(sequence.blocks, dtype=torch.long)
        return table[positions // BLOCK] * BLOCK + positions % BLOCK

    def crop(self, sequence: PagedSequence, length: int) -> None:
        """Forget positions from `length` on (their blocks stay with the sequence until release)."""
        sequence.length = min(sequence.length, length)

    @torch.inference_mode()
    def keep(self, sequence: PagedSequence, start: int, positions: Sequence[int]) -> None:
        """Keep positions [0, start) plus `positions` (ascending, each >= start) moved to start,
        start + 1, ...; forget the rest (a draft tree's accepted branch)."""
        if list(positions) != list(range(start, start + len(positions))):
            source = self.slots_of(sequence, torch.tensor(list(positions), dtype=torch.long))
            target = self.slots(sequence, start, start + len(positions))
            for layers in (self.keys, self.values):
                for store in layers:
                    store[:, :, target] = store[:, :, source]
        sequence.length = start + len(positions)

    def release(self, sequence: PagedSequence) -> None:
        for block in sequence.blocks:
            heapq.heappush(self._free, block)
        sequence.blocks, sequence.length = [], 0

    # ---- what the model's attention layers call during a forward (transformers' Cache protocol) ----
    def begin(self, write_slots: torch.Tensor) -> None:
        """A forward writes its packed new positions to `write_slots`."""
        self._write = write_slots.to(self.device)

    def end(self) -> None:
        self._write = None

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions' keys and values; -> the whole store (paged_attention gathers)."""
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        keys.index_copy_(2, self._write, key_states.to(keys.dtype))
        values.index_copy_(2, self._write, value_states.to(values.dtype))
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    is_compileable = False


@dataclass(frozen=True)
class PagedBatch:
    """How a packed forward's queries meet their own request's keys: request b's new positions are
    packed rows q_index[b, :n_b], its keys the store slots k_index[b, :prefix_b + n_b], `mask`
    [B, 1, n_max, L_max] (0 or the dtype's minimum) what each may attend to; `packed` the padded
    rows (b * n_max + i) that carry the packed positions, in order."""

    q_index: torch.Tensor  # [B, n_max]
    k_index: torch.Tensor  # [B, L_max]
    mask: torch.Tensor  # [B, 1, n_max, L_max]
    packed: torch.Tensor  # [T]


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    paged: PagedBatch | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: with `paged` (a batched forward over PagedKV) each
    request's queries attend to its own keys only, the requests side by side in one SDPA call
    (padded to the longest); without it, transformers' SDPA attention unchanged."""
    if paged is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    batch, n_max = paged.q_index.shape
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[3]
    q = query[0].index_select(1, paged.q_index.reshape(-1)).view(heads, batch, n_max, dim).transpose(0, 1)
    k = key[0].index_select(1, paged.k_index.reshape(-1)).view(kv_heads, batch, -1, dim).transpose(0, 1)
    v = value[0].index_select(1, paged.k_index.reshape(-1)).view(kv_heads, batch, -1, dim).transpose(0, 1)
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=paged.mask, scale=scaling,
                                                           enable_gqa=heads != kv_heads)  # [B, H, n_max, D]
    out = out.transpose(1, 2).reshape(batch * n_max, heads, dim).index_select(0, paged.packed)
    return out[None], None


PAGED_ATTENTION = "specfleet_paged"


def install_paged_attention(model: torch.nn.Module) -> None:
    """Route the model's attention through `paged_attention` (SDPA's masks and kernels otherwise)."""
    AttentionInterface.register(PAGED_ATTENTION, paged_attention)
    AttentionMaskInterface.register(PAGED_ATTENTION, sdpa_mask)
    model.set_attn_implementation(PAGED_ATTENTION)
