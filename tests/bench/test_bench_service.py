"""A bench `serve:` run at concurrency > 1 against the shared live service: every answer that
came back concurrently (streamed) equals plain decoding, and the row reports throughput, latencies
and times to first token."""
import pytest

from actors.sampling import SamplingParams
from deploy.bench import BenchPrompt, Sample, make_engine
from deploy.bench.report import run_row
from deploy.bench.service import ServiceRun

pytestmark = [pytest.mark.model, pytest.mark.ray]
MAX_TOKENS = 24
PROMPTS = [
    BenchPrompt("tr", "translation", messages=[{"role": "user", "content": "Translate to French: I like green apples."}]),
    BenchPrompt("co", "code", messages=[{"role": "user", "content": "Write a Python function that adds two numbers."}]),
    BenchPrompt("ra", "chat", prompt="Once upon a time, in a small village,"),
]


def test_a_concurrent_sweep_through_the_service_is_lossless_and_reports_throughput(service, target):
    plain = make_engine("ar", target, ["none"], 7)
    greedy = SamplingParams(max_tokens=MAX_TOKENS)
    ar = [(p, Sample.from_result(plain.generate(prompt=p.prompt, messages=p.messages, sampling=greedy), 1.0))
          for p in PROMPTS]
    run = ServiceRun.attach(service.url, "smollm2-135m", service.api_key)
    samples, wall_s = run.sweep(PROMPTS, MAX_TOKENS, concurrency=3)
    run.stop()  # attached: the shared service keeps serving
    assert [s.token_ids for s in samples] == [x.token_ids for _, x in ar]
    ar_ids = {p.id: x.token_ids for p, x in ar}
    row = run_row("serve:metasd-ucb-cost@tree@c3", list(zip(PROMPTS, samples)), ar_ids, run_row("ar", ar, ar_ids, None),
                  concurrency=3, wall_s=wall_s)
    assert row["lossless"] and row["concurrency"] == 3
    assert row["tokens_per_s"] == pytest.approx(row["tokens"] / wall_s, rel=1e-3)
    assert 0 < row["latency_p50_s"] <= row["latency_p99_s"] <= wall_s + 1e-3
    assert all(0 < s.first_token_s < s.seconds for s in samples)  # the first text came before the end
    assert 0 < row["ttft_p50_s"] <= row["ttft_p99_s"] < row["latency_p99_s"]
    assert sum(row["drafter_rounds"].values()) > 0  # the service reported its rounds per drafter
    assert ServiceRun.attach(service.url, "smollm2-135m", service.api_key).generate(PROMPTS[2], 4).token_ids
