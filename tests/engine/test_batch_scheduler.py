"""Under continuous batching, on the real embedded model, each greedy request's output equals its
plain decoding alone token for token: eight at once of different lengths (their batched rounds
accepting drafts), trees of several drafts verified in one batch while prompts are prefilled in
chunks, one joining and one cancelled inside a batch of eight, a sampled one beside them; a
cancelled request stops costing forwards at the next iteration; sampled requests verified in
batches emit the target's distribution; the engine reports per batch size its acceptance
calibration and its guard."""
import threading

import pytest
import torch

from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.request import ABORT
from deploy.engine.scheduler import BatchScheduler
from deploy.engine.slot_kv import SlotSequence
from deploy.engine.target import BatchRow
from tests.conftest import CHAT_PROMPTS

pytestmark = pytest.mark.model

PROMPTS = [
    "The history of the printing press begins",
    "def quicksort(items):\n",
    "Q: What is the capital of Japan?\nA:",
    "Once upon a time, in a small village by the sea,",
    "Ingredients for a simple tomato soup:\n1.",
    "The three laws of motion are",
    "import numpy as np\n\ndef mean(values):",
    "Dear hiring manager, I am writing to apply for",
]


def plain_alone(target, prompt_ids: list[int], max_tokens: int) -> list[int]:
    """Plain greedy decoding of one request on transformers' own cache: the reference."""
    cache, output = target.new_cache(), []
    logits = target.forward(cache, prompt_ids)
    while len(output) < max_tokens:
        token = int(logits[-1].argmax())
        if token in target.eos_ids:
            break
        output.append(token)
        logits = target.forward(cache, [token])
    return output


@pytest.fixture(scope="module")
def scheduler(target):
    drafters = build_drafters(["ngram", "suffix", "hierarchy", "none"], None, target.vocab_size)
    return BatchScheduler(SpeculativeEngine(target, drafters))


def test_a_batched_forward_gives_each_request_the_logits_it_gets_alone(target):
    kv, prompts = target.new_kv(), [target.encode(prompt=p) for p in PROMPTS[:4]]
    prompts[0] = prompts[0] * 6  # a row longer than the shared attention call's (a prefill chunk): attended alone
    caches = [SlotSequence() for _ in prompts]
    batched = target.forward_batch(kv, [BatchRow(c, p) for c, p in zip(caches, prompts)])
    for prompt, logits in zip(prompts, batched):
        alone = target.forward(target.new_cache(), prompt)
        assert torch.allclose(logits, alone, atol=5e-3)  # float32 summation order differs run to run (MKL threads)
        assert torch.equal(logits.argmax(-1), alone.argmax(-1))
    assert [c.length for c in caches] == [len(p) for p in prompts]


def test_eight_requests_at_once_each_equal_their_plain_decoding_alone(target, scheduler):
    prompts = [target.encode(prompt=p) for p in PROMPTS]
    lengths = [12, 40, 24, 48, 8, 32, 20, 36]
    futures = [scheduler.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, lengths)]
    sampled = scheduler.submit(prompts[3], SamplingParams(max_tokens=30, temperature=1.0, seed=5))
    results = [f.result(timeout=300) for f in futures]
    for index, (prompt, n, result) in enumerate(zip(prompts, lengths, results)):
        assert result.token_ids == plain_alone(target, prompt, n), f"prompt {index}"
    assert scheduler.rows > scheduler.iterations  # the requests really shared forwards
    assert sum(r.accepted for result in results for r in result.rounds) > 0  # batched rounds accepted drafts
    assert len(sampled.result(timeout=300).token_ids) > 0


def test_trees_of_several_drafts_verified_in_one_batch_with_prompts_prefilled_in_chunks_equal_plain_decoding(target):
    drafters = build_drafters(["ngram", "suffix", "hierarchy", "none"], None, target.vocab_size)
    scheduler = BatchScheduler(SpeculativeEngine(target, drafters, verify="tree"), prefill_tokens=24)
    prompts = [target.encode(messages=m) for m in CHAT_PROMPTS] + [target.encode(prompt=p) for p in PROMPTS[:3]]
    assert max(len(p) for p in prompts) > 24  # a prompt longer than one iteration's prefill budget
    futures = [scheduler.submit(p, SamplingParams(max_tokens=24)) for p in prompts]
    results = [f.result(timeout=300) for f in futures]
    for index, (prompt, result) in enumerate(zip(prompts, results)):
        assert result.token_ids == plain_alone(target, prompt, 24), f"prompt {index}"
    assert any("+" in r.drafter for result in results for r in result.rounds)  # rounds verified several drafts as a tree
    assert scheduler.rows > scheduler.iterations


def test_a_request_joining_and_one_cancelled_inside_a_batch_of_eight(target, scheduler):
    prompts = [target.encode(messages=m) for m in CHAT_PROMPTS]
    companions = [target.encode(prompt=p) for p in PROMPTS[:5]]
    cancelled, streamed = threading.Event(), []
    started = threading.Event()

    def on_tokens(tokens):
        streamed.extend(tokens)
        started.set()
        if len(streamed) >= 4:
            cancelled.set()

    running = [scheduler.submit(p, SamplingParams(max_tokens=24)) for p in companions]
    long_one = scheduler.submit(prompts[0], SamplingParams(max_tokens=32))
    leaving = scheduler.submit(prompts[1], SamplingParams(max_tokens=200), on_tokens, cancelled.is_set)
    assert started.wait(timeout=120)
    joining = scheduler.submit(prompts[2], SamplingParams(max_tokens=16))  # the eighth, joining while seven run
    left = leaving.result(timeout=300)
    assert left.finish_reason == ABORT and len(left.token_ids) < 200
    emitted = [r.emitted for r in left.rounds]
    assert sum(emitted[:-1]) < 4 <= sum(emitted)  # no forward after the round its client left in
    assert left.token_ids == plain_alone(target, prompts[1], len(left.token_ids))
    assert joining.result(timeout=300).token_ids == plain_alone(target, prompts[2], 16)
    assert long_one.result(timeout=300).token_ids == plain_alone(target, prompts[0], 32)
    for prompt, future in zip(companions, running):
        assert future.result(timeout=300).token_ids == plain_alone(target, prompt, 24)
    assert scheduler.engine.kv.owners == []  # every request's slot freed


def test_sampled_requests_verified_in_batches_emit_the_targets_distribution(target):
    """Each request samples (temperature 1, its own seed) two tokens after a prompt where prompt
    lookup drafts " dog", which the target gives p = 0.41: the first token's frequencies must be
    p's. A verifier that resampled from p instead of the residual after a rejection would emit
    " dog" with p + (1 - p) p = 0.65, one that always accepted with 1.0."""
    engine = SpeculativeEngine(target, build_drafters(["ngram", "none"], None, target.vocab_size), policy="fixed:ngram")
    scheduler, draws = BatchScheduler(engine, max_batch=8), 480
    prompt = target.encode(prompt="cat dog cat dog cat dog cat")
    p = torch.softmax(target.forward(target.new_cache(), prompt)[-1], dim=-1)
    drafted = build_drafters(["ngram"])["ngram"].propose("probe", prompt, 2, SamplingParams(temperature=1.0, seed=0))
    dog = drafted.token_ids[0]
    assert 0.3 < p[dog] < 0.5 and p.topk(5).values.sum() < 0.75  # the draft is rejected often; p has a tail
    futures = [scheduler.submit(prompt, SamplingParams(max_tokens=2, temperature=1.0, seed=seed)) for seed in range(draws)]
    results = [f.result(timeout=600) for f in futures]
    assert sum(r.rounds[0].drafted > 0 for r in results) == draws  # every first token went through rejection sampling
    assert scheduler.rows > scheduler.iterations  # in batches
    first = torch.tensor([r.token_ids[0] for r in results])
    sigma = (p[dog] * (1 - p[dog]) / draws).sqrt()
    assert abs((first == dog).float().mean() - p[dog]) < 4 * sigma
    assert abs(p[dog] + (1 - p[dog]) * p[dog] - p[dog]) > 8 * sigma  # the check tells the broken verifier apart
    buckets = p.topk(5).indices.tolist()
    frequencies = [(first == token).float().mean() for token in buckets]
    expected = [p[token] for token in buckets]
    rest = 1 - sum(frequencies), 1 - sum(expected)
    assert 0.5 * (sum(abs(f - e) for f, e in zip(frequencies, expected)) + abs(rest[0] - rest[1])) < 0.08


def test_bad_input_fails_its_own_request_and_the_scheduler_keeps_serving(target, scheduler):
    too_long = scheduler.submit([1] * 10, SamplingParams(max_tokens=target.context_length))
    with pytest.raises(Exception, match="max_tokens"):
        too_long.result(timeout=60)
    prompt = target.encode(prompt=PROMPTS[0])
    assert scheduler.run(prompt, SamplingParams(max_tokens=6)).token_ids == plain_alone(target, prompt, 6)


def test_the_engine_reports_per_batch_size_what_its_batches_verified_and_what_drafting_realised(target):
    from deploy.engine.draft_guard import PROBES

    drafters = build_drafters(["ngram", "suffix", "none"], None, target.vocab_size)
    scheduler = BatchScheduler(SpeculativeEngine(target, drafters))
    repetitive = target.encode(prompt="one two three four five one two three four five one two three four five one two")
    futures = [scheduler.submit(repetitive, SamplingParams(max_tokens=40)) for _ in range(4)]
    for future in futures:
        future.result(timeout=300)
    report = scheduler.engine.load_report()
    guard = report["guard"]["3-4"]
    assert guard["plain_iterations"] >= PROBES and guard["drafted_iterations"] > 0  # probed plain, then drafted
    calibration = report["calibration"]["3-4"]
    assert calibration["nodes"] > 0 and 0.0 <= calibration["accepted"] <= 1.0 and 0.0 < calibration["expected"] <= 1.0


def test_a_batch_whose_budget_is_zero_asks_no_drafter_and_still_decodes_exactly(target):
    from actors.ngram import NgramProposer

    class CountingNgram(NgramProposer):
        asked = 0

        def propose(self, *args, **kwargs):
            CountingNgram.asked += 1
            return super().propose(*args, **kwargs)

    engine = SpeculativeEngine(target, {"ngram": CountingNgram(), "none": build_drafters(["none"], None)["none"]},
                               policy="fixed:ngram")
    engine.enable_batching()
    engine.planner.guard.drafts = lambda rows: False  # the guard keeps this batch size plain: budget 0
    prompts = [target.encode(prompt=p) for p in PROMPTS[:3]]
    requests = [engine.open(p, SamplingParams(max_tokens=6)) for p in prompts]
    while any(r.finish is None for r in requests):
        engine.iterate([r for r in requests if r.finish is None])
    assert CountingNgram.asked == 0
    for prompt, request in zip(prompts, requests):
        assert engine.result(request).token_ids == plain_alone(target, prompt, 6)
        engine.close(request)
