"""A distilled drafter's compact step (int8 weights, a compiled one-token forward, its own K/V
cache) predicts as the float32 drafter does, whether tokens come one at a time or as a catch-up,
after a crop and past its first capacity, compiled or not; as a proposer it drafts token ids."""
import logging

import pytest
import torch

from actors.compact_step import MIN_CAPACITY, CompactLM, compiled_step
from actors.hf import HFModelProposer
from actors.models import load_draft_model, load_tokenizer
from actors.sampling import SamplingParams
from actors.specialists import specialist_path

pytestmark = pytest.mark.model
TEXT = ("Question: A train travels 60 km in 1.5 hours. What is its average speed? Let's think step by step. "
        "The train travels 60 km in 1.5 hours, so its average speed is 60 / 1.5 = 40 km per hour. "
        "Next question: a shop sells 3 pens for 2 dollars. How much do 12 pens cost?")


@pytest.fixture(scope="module")
def drafter():
    return load_draft_model(str(specialist_path("distill-math")))


@pytest.fixture(scope="module")
def compact(drafter):
    return CompactLM.from_model(drafter.base, drafter.head.weight, drafter.head_ids)


@pytest.fixture(scope="module")
def ids():
    return load_tokenizer()(TEXT)["input_ids"]


def reference_top1(drafter, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return drafter.head_logits(torch.tensor([ids]))[0].argmax(-1)


def one_at_a_time(compact: CompactLM, ids: list[int], cache=None) -> torch.Tensor:
    cache = cache if cache is not None else compact.new_cache()
    return torch.stack([compact(torch.tensor([[t]]), cache).logits[0, 0] for t in ids])


def test_one_token_steps_agree_with_the_float32_drafter_on_a_real_text(drafter, compact, ids):
    agree = (one_at_a_time(compact, ids).argmax(-1) == reference_top1(drafter, ids)).float().mean()
    assert agree >= 0.95


def test_a_catch_up_gives_what_one_token_steps_give(compact, ids):
    cache = compact.new_cache()
    caught_up = compact(torch.tensor([ids]), cache).logits[0, 0]
    stepped = one_at_a_time(compact, ids)[-1]
    assert cache.length == len(ids)
    assert caught_up.argmax() == stepped.argmax() and torch.allclose(caught_up, stepped, atol=0.2)


def test_a_cropped_cache_continues_as_a_fresh_one(compact, ids):
    cache = compact.new_cache()
    compact(torch.tensor([ids]), cache)
    cache.crop(-(len(ids) - 20))  # as actors/kv_cache.crop_cache rolls back rejected drafts
    assert cache.get_seq_length() == 20
    again = one_at_a_time(compact, ids[20:40], cache)
    fresh = one_at_a_time(compact, ids[:40])[20:]
    assert torch.allclose(again, fresh, atol=1e-4)


def test_the_cache_grows_past_its_first_capacity_and_still_predicts(drafter, compact, ids):
    long = (ids * (MIN_CAPACITY // len(ids) + 2))[: MIN_CAPACITY + 40]
    cache = compact.new_cache()
    compact(torch.tensor([long[:MIN_CAPACITY - 10]]), cache)
    tail = one_at_a_time(compact, long[MIN_CAPACITY - 10:], cache)
    assert cache.capacity > MIN_CAPACITY and cache.length == len(long)
    assert (tail.argmax(-1) == reference_top1(drafter, long)[MIN_CAPACITY - 10:]).float().mean() >= 0.95


def test_without_a_compiler_every_step_runs_eagerly_with_the_same_predictions(drafter, compact, ids, monkeypatch, caplog):
    def no_compiler(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    eager = CompactLM.from_model(drafter.base, drafter.head.weight, drafter.head_ids)
    monkeypatch.setattr(torch, "compile", no_compiler)
    compiled_step.cache_clear()  # the process's compiled step is made again, and fails
    try:
        with caplog.at_level(logging.WARNING, logger="specfleet"):
            steps = one_at_a_time(eager, ids[:30])
    finally:
        compiled_step.cache_clear()
    assert "did not compile" in caplog.text and eager._compiled is False
    assert (steps.argmax(-1) == one_at_a_time(compact, ids[:30]).argmax(-1)).float().mean() >= 0.95


def test_as_a_proposer_it_drafts_token_ids_of_its_head_greedy_or_sampled(compact, ids):
    proposer = HFModelProposer(compact, name="distill-math.model", target_vocab_size=compact.vocab_size)
    head = set(compact.vocabulary.tolist())
    greedy = proposer.propose("g", ids, 5, SamplingParams())
    assert len(greedy.token_ids) == 5 and set(greedy.token_ids) <= head
    sampled = proposer.propose("s", ids, 5, SamplingParams(temperature=0.8, seed=3))
    for token, q in zip(sampled.token_ids, sampled.q):
        assert token in q.ids and set(q.ids) <= head and sum(q.probs) == pytest.approx(1.0, abs=1e-5)


def test_a_torch_without_the_int8_product_leaves_the_drafter_as_it_is(drafter, monkeypatch):
    from actors.compact_step import for_drafting

    def missing(*args, **kwargs):
        raise RuntimeError("no such operator")

    monkeypatch.setattr(torch, "_weight_int8pack_mm", missing)
    compiled_step.cache_clear()
    monkeypatch.setattr(torch, "compile", lambda fn, **kwargs: fn)  # eager: the missing op is met at load
    try:
        assert for_drafting(drafter) is drafter
    finally:
        compiled_step.cache_clear()
