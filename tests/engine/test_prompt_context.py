"""The engine hands the coordinator the target's own representation of each prompt (the mean of its
last hidden states over the prefilled prompt) on the request's first call only, alone and when the
scheduler prefills in chunks; a contextual coordinator remembers it."""
import numpy as np
import torch

from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.scheduler import BatchScheduler
from policy.coordinator import Coordinator
from tests.conftest import CHAT_PROMPTS


def recording(target) -> tuple[Coordinator, list]:
    coordinator = Coordinator(build_drafters(["ngram", "suffix"]), policy="metasd-ucb-cost-context")
    calls, propose_batch = [], coordinator.propose_batch
    coordinator.propose_batch = lambda batch: calls.extend(batch) or propose_batch(batch)
    return coordinator, calls


def prompt_mean(target, prompt: list[int]) -> np.ndarray:
    with torch.inference_mode():
        hidden = target.model.model(input_ids=torch.tensor([prompt[:-1]]), use_cache=False).last_hidden_state[0]
    return hidden.mean(dim=0).numpy()


def test_the_first_call_alone_carries_the_prompts_mean_last_hidden_state(target):
    coordinator, calls = recording(target)
    engine = SpeculativeEngine(target, coordinator=coordinator)
    prompt = target.encode(messages=CHAT_PROMPTS[0])
    engine.run(prompt, SamplingParams(max_tokens=8))
    assert len(calls) > 1 and calls[0].context.shape == (target.model.config.hidden_size,)
    assert np.allclose(calls[0].context, prompt_mean(target, prompt), atol=1e-3)
    assert all(call.context is None for call in calls[1:])
    assert len(coordinator.contexts) == 1  # the finished request is remembered with what it saw


def test_a_prompt_prefilled_in_chunks_sends_the_mean_over_every_chunk(target):
    coordinator, calls = recording(target)
    engine = SpeculativeEngine(target, coordinator=coordinator)
    prompts = [target.encode(messages=messages) for messages in CHAT_PROMPTS[:2]]
    scheduler = BatchScheduler(engine, max_batch=2, prefill_tokens=7)  # every prompt takes several iterations
    futures = [scheduler.submit(prompt, SamplingParams(max_tokens=6)) for prompt in prompts]
    [future.result(timeout=120) for future in futures]
    first = {}
    for call in calls:
        first.setdefault(call.request_id, call)
    assert len(first) == 2
    sent = sorted((call.context for call in first.values()), key=lambda c: float(c[0]))
    expected = sorted((prompt_mean(target, prompt) for prompt in prompts), key=lambda c: float(c[0]))
    assert all(np.allclose(s, e, atol=1e-3) for s, e in zip(sent, expected))
