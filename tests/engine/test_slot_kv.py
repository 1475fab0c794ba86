"""The slot KV store (deploy/engine/slot_kv.py): a request that leaves hands its slot to the last
one, whose cache moves intact; the stores grow and shrink back; rows share an attention call by
their count of new positions, split where the slots between them would cost more padding than a
call, and a prefill chunk attends alone."""
import torch

from deploy.engine.slot_kv import INITIAL_CAPACITY, RowSpec, SlotKV, SlotSequence, call_groups


def _filled(kv: SlotKV, sequence: SlotSequence, length: int, value: float) -> None:
    kv.reserve(sequence, length)
    for store in kv.keys + kv.values:
        store[sequence.slot, :, :length] = value
    sequence.length = length


def test_a_leaving_request_s_slot_goes_to_the_last_one_whose_cache_moves_intact_and_the_stores_grow_and_shrink():
    kv = SlotKV(num_layers=2, kv_heads=1, head_dim=2, dtype=torch.float32, device=torch.device("cpu"), slots=2)
    first, second, third = SlotSequence(), SlotSequence(), SlotSequence()
    _filled(kv, first, 5, 1.0)
    _filled(kv, second, 3, 2.0)
    _filled(kv, third, 2 * INITIAL_CAPACITY + 1, 3.0)  # no slot left and longer than the capacity: both double, twice
    assert (first.slot, second.slot, third.slot, kv.slots, kv.capacity) == (0, 1, 2, 4, 4 * INITIAL_CAPACITY)
    assert all(torch.equal(store[0, :, :5], torch.ones(1, 5, 2)) for store in kv.keys + kv.values)  # kept while growing
    kv.release(first)  # the last slot's request moves into slot 0
    assert (first.slot, third.slot, second.slot) == (-1, 0, 1) and kv.owners == [third, second]
    assert all(torch.equal(store[0, :, : third.length], torch.full((1, third.length, 2), 3.0)) for store in kv.keys)
    kv.release(first)  # released twice: nothing moves
    assert kv.owners == [third, second]
    kv.release(third)  # what is left needs 3 positions in one slot: the stores shrink back
    assert (second.slot, kv.slots, kv.capacity) == (0, 4, INITIAL_CAPACITY)
    assert all(torch.equal(store[0, :, :3], torch.full((1, 3, 2), 2.0)) for store in kv.values)


def test_rows_share_a_call_by_their_count_of_new_positions_and_a_prefill_chunk_attends_alone():
    new = [1, 1, 1, 8, 1, 1, 8, 1, 200]  # slot i holds row i
    rows = [RowSpec(SlotSequence(slot=i, length=10), n) for i, n in enumerate(new)]
    groups = sorted(call_groups(rows))
    # the single-token rows in one call (slots 3 and 6 between them: one padding query each);
    # the two 8-position drafts apart (two slots between them would pad 16 queries); the chunk alone
    assert groups == [[0, 1, 2, 4, 5, 7], [3], [6], [8]]
