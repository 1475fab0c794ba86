"""Peer runs decode exactly what plain target decoding does (the bench checks their output like
ours), the assistant peer included when a draft model is configured, and the served peer
(`transformers serve`) answers the same text over HTTP."""
import pytest

from actors.errors import InvalidRequestError
from actors.sampling import SamplingParams
from deploy.bench import BenchPrompt, make_engine
from deploy.bench.peers import HFBatchPeer, HFContinuousPeer, HFPeer, HFServePeer
from tests.conftest import CHAT_PROMPTS

pytestmark = pytest.mark.model
MAX_TOKENS = 24


@pytest.mark.parametrize("peer", ["hf-generate", "hf-prompt-lookup", "hf-assistant"])
def test_each_peer_matches_plain_decoding_token_for_token(target, early_exit_drafter_model, peer):
    plain = make_engine("ar", target, ["none"], 7)
    runner = HFPeer(peer, target, early_exit_drafter_model)
    for messages in CHAT_PROMPTS[:2]:
        expected = plain.generate(messages=messages, sampling=SamplingParams(max_tokens=MAX_TOKENS)).token_ids
        sample = runner.generate(BenchPrompt("p", "t", messages=messages), MAX_TOKENS)
        assert sample.token_ids == expected
        assert sample.seconds > 0 and sample.rounds == 0


def test_a_peer_that_stops_at_eos_drops_the_eos_token(target):
    question = [{"role": "user", "content": "What is 2 + 2? Answer with one number."}]  # ends well before 64 tokens
    sample = HFPeer("hf-generate", target).generate(BenchPrompt("p", "t", messages=question), 64)
    assert not set(sample.token_ids) & target.eos_ids and len(sample.token_ids) < 64


def test_the_assistant_peer_without_a_draft_model_is_refused_naming_runs(target):
    with pytest.raises(InvalidRequestError) as err:
        HFPeer("hf-assistant", target)
    assert err.value.field == "runs"


def test_the_batching_peer_decodes_left_padded_groups_as_plain_decoding_does(target):
    plain = make_engine("ar", target, ["none"], 7)
    prompts = [BenchPrompt(f"p{i}", "t", messages=m) for i, m in enumerate(CHAT_PROMPTS)]
    samples, wall_s = HFBatchPeer(target).sweep(prompts, MAX_TOKENS, concurrency=2)  # groups of 2 and 1
    for item, sample in zip(prompts, samples):
        assert sample.token_ids == plain.generate(messages=item.messages,
                                                  sampling=SamplingParams(max_tokens=MAX_TOKENS)).token_ids
    assert samples[0].seconds == samples[1].seconds <= wall_s  # one group, one latency
    assert 0 < samples[0].first_token_s == samples[1].first_token_s < samples[0].seconds  # its first step


def test_the_continuous_batching_peer_decodes_as_plain_decoding_does_and_gives_back_the_model(target):
    plain = make_engine("ar", target, ["none"], 7)
    prompts = [BenchPrompt(f"p{i}", "t", messages=m) for i, m in enumerate(CHAT_PROMPTS)]
    expected = [plain.generate(messages=p.messages, sampling=SamplingParams(max_tokens=MAX_TOKENS)).token_ids
                for p in prompts]
    attention = target.model.config._attn_implementation  # the engine's
    samples, wall_s = HFContinuousPeer(target).sweep(prompts, MAX_TOKENS, concurrency=2)
    assert [s.token_ids for s in samples] == expected
    assert all(0 < s.first_token_s < s.seconds <= wall_s for s in samples)
    assert target.model.config._attn_implementation == attention  # given back to the engine


def test_the_served_peer_answers_over_http_as_plain_decoding_does_and_its_server_stops(target):
    """`transformers serve --continuous-batching` in a process of its own: chat and completion
    prompts streamed by two clients, the text equal to plain decoding's; the server is gone after."""
    import psutil

    plain = make_engine("ar", target, ["none"], 7)
    prompts = [BenchPrompt("chat", "t", messages=CHAT_PROMPTS[0]), BenchPrompt("text", "t", prompt="def fibonacci(n):")]
    expected = [plain.generate(prompt=p.prompt, messages=p.messages, sampling=SamplingParams(max_tokens=12)).token_ids
                for p in prompts]
    peer = HFServePeer(target)
    peer.reference = {p.id: ids for p, ids in zip(prompts, expected)}  # what its text stands for when equal
    samples, wall_s = peer.sweep(prompts, 12, concurrency=2)
    assert [s.token_ids for s in samples] == expected  # text equal to plain decoding's, token for token
    assert all(0 < s.first_token_s < s.seconds <= wall_s for s in samples)
    assert not [p for p in psutil.process_iter(["cmdline"]) if "transformers.cli" in " ".join(p.info["cmdline"] or [])]
