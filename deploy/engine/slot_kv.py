"""Slot KV for many requests in one target forward: per layer one store [slots, kv heads, capacity,
head dim]; each request's keys and values lie contiguous in its own slot, written in place.

`SlotKV` is what the target model's attention sees as its cache during a batched forward
(`TargetModel.forward_batch`): every request's new positions are packed into one row of tokens
(no padding in the linear layers); `update` writes their keys and values into their requests' slots
and returns the stores; `slot_attention` then lets each request's queries attend to a view of its
own slot, nothing copied: rows that add a similar count of positions (a decoding step, a draft, a
draft tree) side by side in one SDPA call over the slots they span (`call_groups`), each longer
row (a prefill chunk) in a call of its own, so a long row pads no short row's queries. Masks come
from the rows' lengths in one broadcast (a tree row's block of new positions from its parents).

Requests in flight hold slots 0..n-1: when one leaves, the request in the last slot moves into its
slot (one copy per request that leaves, none per forward). The stores grow by doubling (slots as
requests join, capacity as the longest request grows) and shrink back to twice what the requests
in flight need once that is a quarter of them, so memory is about slots x the longest request.
A request's cache is a `SlotSequence` (its slot and length): `crop` rolls it back, `keep` moves a
draft tree's accepted branch into place, `release` frees the slot.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from deploy.engine.draft_tree import attention_allowed

INITIAL_SLOTS = 4
INITIAL_CAPACITY = 256  # positions per slot
SHARED_CALL_MAX = 64  # rows adding at most this many positions share attention calls (call_groups)
MAX_GAP_QUERIES = 2  # padding queries a shared call may spend on the slots between its rows (a row costs about a call)


@dataclass(eq=False)
class SlotSequence:
    """One request's cache: `length` positions in slot `slot` of the store (-1: none yet)."""

    slot: int = -1
    length: int = 0


@dataclass(frozen=True)
class RowSpec:
    """A row of a batched forward as the store sees it: its cache, its new positions, a token tree's parents."""

    cache: SlotSequence
    new: int
    parents: Sequence[int] | None = None


@dataclass(frozen=True)
class AttentionCall:
    """One SDPA call: queries [G, heads, n_max, dim] gathered from the packed row (`queries`,
    [G * n_max], padding -> token 0) against the stores' slots [first, first + G), positions
    [0, length); `mask` [G, 1, n_max, length]; the outputs at padded rows `outputs` belong to packed
    tokens `tokens`."""

    first: int
    length: int
    queries: torch.Tensor
    mask: torch.Tensor
    outputs: torch.Tensor
    tokens: torch.Tensor


@dataclass(frozen=True)
class SlotBatch:
    """A packed forward's plan: where its tokens' keys and values go, and its attention calls."""

    write_slots: torch.Tensor  # [T]
    write_positions: torch.Tensor  # [T]
    calls: tuple[AttentionCall, ...]


def call_groups(rows: Sequence[RowSpec]) -> list[list[int]]:
    """Which rows share an attention call (indices into `rows`). A call pads every row to its
    longest and spans every slot between its first and last, so rows share one by their count of
    new positions in powers of two (1, 2, 3-4, 5-8, ... 33-64: one 8-position draft does not make
    31 single-token rows attend with 8 queries each), a group split where the slots between two
    rows would add more than MAX_GAP_QUERIES padding queries; a longer row (a prefill chunk) alone."""
    buckets: dict[int, list[int]] = {}
    groups: list[list[int]] = []
    for i, row in enumerate(rows):
        if row.new > SHARED_CALL_MAX:
            groups.append([i])
        else:
            buckets.setdefault((row.new - 1).bit_length(), []).append(i)
    for bucket, members in sorted(buckets.items()):
        members.sort(key=lambda i: rows[i].cache.slot)
        group = [members[0]]
        for i in members[1:]:
            if (rows[i].cache.slot - rows[group[-1]].cache.slot - 1) * 2 ** bucket > MAX_GAP_QUERIES:
                groups.append(group)
                group = []
            group.append(i)
        groups.append(group)
    return groups


class SlotKV:
    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, device: torch.device,
                 slots: int = INITIAL_SLOTS, capacity: int = INITIAL_CAPACITY) -> None:
        self.shape, self.dtype, self.device = (kv_heads, head_dim), dtype, device
        self.keys = [self._empty(slots, capacity) for _ in range(num_layers)]
        self.values = [self._empty(slots, capacity) for _ in range(num_layers)]
        self.owners: list[SlotSequence] = []  # owners[i] holds slot i
        self._batch: SlotBatch | None = None  # during a forward

    @classmethod
    def for_model(cls, model: torch.nn.Module) -> "SlotKV":
        config = model.config
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(config.num_hidden_layers, kv_heads, head_dim, model.dtype, next(model.parameters()).device)

    def _empty(self, slots: int, capacity: int) -> torch.Tensor:
        return torch.zeros(slots, self.shape[0], capacity, self.shape[1], dtype=self.dtype, device=self.device)

    @property
    def slots(self) -> int:
        return self.keys[0].shape[0]

    @property
    def capacity(self) -> int:
        return self.keys[0].shape[2]

    def _resize(self, slots: int, capacity: int) -> None:
        used, kept = len(self.owners), min(capacity, self.capacity)
        for layers in (self.keys, self.values):
            for i, store in enumerate(layers):
                layers[i] = self._empty(slots, capacity)
                layers[i][:used, :, :kept] = store[:used, :, :kept]

    def reserve(self, sequence: SlotSequence, length: int) -> None:
        """Give `sequence` a slot (if it has none) with room for `length` positions."""
        if sequence.slot < 0:
            if len(self.owners) == self.slots:
                self._resize(2 * self.slots, self.capacity)
            sequence.slot = len(self.owners)
            self.owners.append(sequence)
        if length > self.capacity:
            capacity = self.capacity
            while capacity < length:
                capacity *= 2
            self._resize(self.slots, capacity)

    def crop(self, sequence: SlotSequence, length: int) -> None:
        """Forget positions from `length` on."""
        sequence.length = min(sequence.length, length)

    @torch.inference_mode()
    def keep(self, sequence: SlotSequence, start: int, positions: Sequence[int]) -> None:
        """Keep positions [0, start) plus `positions` (ascending, each >= start) moved to start,
        start + 1, ...; forget the rest (a draft tree's accepted branch)."""
        if list(positions) != list(range(start, start + len(positions))):
            source = torch.tensor(list(positions), dtype=torch.long, device=self.device)
            for layers in (self.keys, self.values):
                for store in layers:
                    store[sequence.slot, :, start : start + len(positions)] = store[sequence.slot].index_select(1, source)
        sequence.length = start + len(positions)

    @torch.inference_mode()
    def release(self, sequence: SlotSequence) -> None:
        """Free `sequence`'s slot: the request in the last slot moves into it."""
        if 0 <= sequence.slot < len(self.owners) and self.owners[sequence.slot] is sequence:
            last = self.owners.pop()
            if last is not sequence:
                for layers in (self.keys, self.values):
                    for store in layers:
                        store[sequence.slot, :, : last.length] = store[last.slot, :, : last.length]
                last.slot = sequence.slot
                self.owners[last.slot] = last
            self._shrink()
        sequence.slot, sequence.length = -1, 0

    def _shrink(self) -> None:
        needed = max([s.length for s in self.owners], default=0)
        capacity, slots = self.capacity, self.slots
        while capacity >= 4 * max(needed, 1) and capacity > INITIAL_CAPACITY:
            capacity //= 2
        while slots >= 4 * max(len(self.owners), 1) and slots > INITIAL_SLOTS:
            slots //= 2
        if (slots, capacity) != (self.slots, self.capacity):
            self._resize(slots, capacity)

    # ---- one forward ----
    def plan(self, rows: Sequence[RowSpec]) -> SlotBatch:
        """The packed forward of `rows` (their slots reserved; each row's new positions follow its
        cache's `length`): its writes and attention calls."""
        writes_slot, writes_pos, starts, start = [], [], [], 0
        for row in rows:
            writes_slot.append(torch.full((row.new,), row.cache.slot, dtype=torch.long))
            writes_pos.append(torch.arange(row.cache.length, row.cache.length + row.new))
            starts.append(start)
            start += row.new
        calls = tuple(self._call([rows[i] for i in members], [starts[i] for i in members])
                      for members in call_groups(rows))
        return SlotBatch(torch.cat(writes_slot).to(self.device), torch.cat(writes_pos).to(self.device), calls)

    def _call(self, rows: Sequence[RowSpec], starts: Sequence[int]) -> AttentionCall:
        first = min(row.cache.slot for row in rows)
        span = max(row.cache.slot for row in rows) + 1 - first
        n_max = max(row.new for row in rows)
        length = max(row.cache.length + row.new for row in rows)
        prefix = torch.zeros(span, dtype=torch.long)
        queries = torch.zeros(span, n_max, dtype=torch.long)
        outputs, tokens = [], []
        for row, start in zip(rows, starts):
            g = row.cache.slot - first
            prefix[g] = row.cache.length
            queries[g, : row.new] = torch.arange(start, start + row.new)
            outputs.append(torch.arange(g * n_max, g * n_max + row.new))
            tokens.append(torch.arange(start, start + row.new))
        # a chain's position i sees the cache and new positions up to itself; padding sees a prefix of its slot
        allowed = torch.arange(length)[None, None, :] <= (prefix[:, None, None] + torch.arange(n_max)[None, :, None])
        for row in rows:  # a tree row's block of new positions: each sees its ancestors and itself
            if row.parents is not None:
                g, prefix_length = row.cache.slot - first, row.cache.length
                allowed[g, : row.new, prefix_length : prefix_length + row.new] = attention_allowed(row.parents, 0)
        mask = torch.zeros(allowed.shape, dtype=self.dtype).masked_fill_(~allowed, torch.finfo(self.dtype).min)
        return AttentionCall(first, length, queries.reshape(-1).to(self.device), mask[:, None].to(self.device),
                             torch.cat(outputs).to(self.device), torch.cat(tokens).to(self.device))

    def begin(self, batch: SlotBatch) -> None:
        self._batch = batch

    def end(self) -> None:
        self._batch = None

    # ---- what the model's attention layers call during a forward (transformers' Cache protocol) ----
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               cache_kwargs: dict | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the new positions' keys and values ([1, kv heads, T, dim]) into their slots; -> the stores."""
        keys, values, batch = self.keys[layer_idx], self.values[layer_idx], self._batch
        keys[batch.write_slots, :, batch.write_positions] = key_states[0].transpose(0, 1).to(keys.dtype)
        values[batch.write_slots, :, batch.write_positions] = value_states[0].transpose(0, 1).to(values.dtype)
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    is_compileable = False


def slot_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                   slots: SlotBatch | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: with `slots` (a batched forward over SlotKV, `key` and
    `value` its stores) each request's queries attend to views of its own slot; without it,
    transformers' SDPA attention unchanged. -> [1, T, heads, dim]."""
    if slots is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    heads, tokens, dim = query.shape[1], query.shape[2], query.shape[3]
    packed = query[0].transpose(0, 1)  # [T, heads, dim]
    out = query.new_empty(tokens, heads, dim)
    for call in slots.calls:
        span = call.mask.shape[0]
        q = packed.index_select(0, call.queries).view(span, -1, heads, dim).transpose(1, 2)
        k = key[call.first : call.first + span, :, : call.length]
        v = value[call.first : call.first + span, :, : call.length]
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=call.mask, scale=scaling,
                                                             enable_gqa=heads != k.shape[1])  # [G, heads, n_max, dim]
        out.index_copy_(0, call.tokens, o.transpose(1, 2).reshape(-1, heads, dim).index_select(0, call.outputs))
    return out[None], None


SLOT_ATTENTION = "specfleet_slots"


def install_slot_attention(model: torch.nn.Module) -> None:
    """Route the model's attention through `slot_attention` (SDPA's masks and kernels otherwise)."""
    AttentionInterface.register(SLOT_ATTENTION, slot_attention)
    AttentionMaskInterface.register(SLOT_ATTENTION, sdpa_mask)
    model.set_attn_implementation(SLOT_ATTENTION)
