"""The eagle drafter (an EAGLE-3 head) on the real embedded target: training-time test attends as
drafting does; the features it drafts from are the target's own fused hidden states, alone and in a
batch with chunked prefills; its greedy output equals plain decoding (chain, tree, batched); its
sampled drafts follow the q it sends; a head trains, saves and loads; a tiny head builds end to end
from a generated corpus shard."""
import shutil

import numpy as np
import pytest
import torch

from actors.eagle import EagleProposer, causal_allowed
from actors.eagle_head import EagleHead, eagle_dir, load_head, saved_head_ids
from actors.errors import InvalidRequestError
from actors.no_draft import NO_DRAFT
from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.bench.runs import eagle_head_params
from deploy.engine.draft_tree import DraftTree
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.scheduler import BatchScheduler
from deploy.engine.tree_verify import verify_tree
from deploy.specialists.corpus import target_outputs
from deploy.specialists.eagle import _ttt_attention, build_eagle, train_eagle
from deploy.specialists.eagle_corpus import build_shards, read_shard, shard_path
from tests.conftest import CHAT_PROMPTS

pytestmark = pytest.mark.model
GREEDY = SamplingParams(max_tokens=32)


def fused_features(target, tokens: list[int]) -> torch.Tensor:
    """The target's own features of these tokens, as a plain forward computes them [n, 3H]."""
    with torch.inference_mode():
        outputs = target.model.model(input_ids=torch.tensor([tokens]), output_hidden_states=True)
    return target.fused_features(outputs)[0]


class RecordingEagle(EagleProposer):
    """An eagle drafter that keeps every session's tokens and features as they arrive."""

    def __init__(self, head) -> None:
        super().__init__(head)
        self.seen: dict[str, tuple[list[int], list[torch.Tensor]]] = {}

    def propose(self, session, context_delta, k, sampling, features=None):
        tokens, chunks = self.seen.setdefault(session, ([], []))
        tokens.extend(context_delta)
        chunks.extend([features] if isinstance(features, torch.Tensor) else features or ())
        return super().propose(session, context_delta, k, sampling, features)


@pytest.fixture(scope="module")
def trained(target, tmp_path_factory):
    """A head trained (no held-out share) on the target's own answers to the test prompts, loaded back; a
    vocabulary of 2,048 tokens (their answers' tokens among them) keeps each draft cheap."""
    out = tmp_path_factory.mktemp("eagle") / "head"
    manifest = train_eagle(target, target_outputs(target, CHAT_PROMPTS, max_new_tokens=32), out, epochs=40, lr=3e-3,
                           heldout=0.0, vocabulary=2048)
    head = load_head(out, target.model.config, target.model.get_input_embeddings().weight)
    return head, manifest, out


@pytest.fixture(scope="module")
def plain(target):
    engine = SpeculativeEngine(target, build_drafters([NO_DRAFT]), policy=f"fixed:{NO_DRAFT}")
    return [engine.generate(messages=m, sampling=GREEDY) for m in CHAT_PROMPTS]


def test_training_time_test_attends_as_drafting_does(target):
    """Step j of training, at position t, computes what drafting computes j tokens after the verified pair t - j."""
    torch.manual_seed(0)
    head = EagleHead.from_target(target.model, torch.arange(100, 2100)).eval()
    tokens, fused = torch.randint(100, 2000, (1, 12)), torch.randn(1, 12, 3 * 576)
    positions = torch.arange(12)[None]
    with torch.no_grad():
        g, keys, values, trained_outputs = head.fused(fused), [], [], []
        inputs = g
        for step in range(3):
            x, q, k, v = head.qkv(tokens, inputs, positions)
            keys.append(head.expand_kv(k))
            values.append(head.expand_kv(v))
            trained_outputs.append(head.finish(x, _ttt_attention(q, keys, values, step)))
            inputs = torch.cat([trained_outputs[-1][:, :1], trained_outputs[-1][:, :-1]], dim=1)
        verified = 8
        out, k_cache, v_cache = head.step(tokens[:, :verified], g[:, :verified], positions[:, :verified], head.empty_kv(),
                                          head.empty_kv(), causal_allowed(0, verified))
        assert torch.allclose(out[0], trained_outputs[0][0, :verified], atol=1e-3)
        h = out[:, -1:]
        for j in (1, 2):
            at = verified - 1 + j
            h, k_cache, v_cache = head.step(tokens[:, at : at + 1], h, positions[:, at : at + 1], k_cache, v_cache,
                                            torch.ones(1, 1, k_cache.shape[2] + 1, dtype=torch.bool))
            assert torch.allclose(h[0, 0], trained_outputs[j][0, at], atol=1e-3)
        # a broken training attention (a drafted step seeing later true pairs) does not match
        assert not torch.allclose(trained_outputs[1][0, verified], trained_outputs[0][0, verified], atol=1e-3)


def test_training_lowers_the_heads_loss_and_the_manifest_says_what_was_built(trained):
    _, manifest, out = trained
    assert manifest["epoch_losses"][-1] < 0.5 * manifest["epoch_losses"][0]
    assert manifest["recipe"]["ttt_steps"] == 3 and manifest["examples"] == len(CHAT_PROMPTS)
    assert (out / "eagle.safetensors").stat().st_size < 25e6 and not (out.parent / ".head.checkpoint.pt").exists()


def test_the_eagle_drafter_reproduces_plain_greedy_decoding_and_its_drafts_are_accepted(target, trained, plain):
    engine = SpeculativeEngine(target, {"eagle": EagleProposer(trained[0])}, policy="fixed:eagle", cut_drafts=False)
    accepted = 0
    for index, messages in enumerate(CHAT_PROMPTS):
        result = engine.generate(messages=messages, sampling=GREEDY)
        assert result.token_ids == plain[index].token_ids, f"prompt {index}"
        accepted += result.summary["num_accepted_draft_tokens"]
    # the head learnt these answers: it can only draft them from features that line up with the tokens
    assert accepted > len(plain) * 10


def test_the_features_a_session_receives_are_the_targets_own_hidden_states_in_a_batch(target, trained):
    drafter = RecordingEagle(trained[0])
    engine = SpeculativeEngine(target, {"eagle": drafter, "ngram": build_drafters(["ngram"])["ngram"]},
                               policy="metasd-ucb")
    scheduler = BatchScheduler(engine, prefill_tokens=16)  # prompts are prefilled in chunks, beside decoding
    futures = [scheduler.submit(target.encode(messages=m), GREEDY) for m in CHAT_PROMPTS]
    results = [f.result(timeout=300) for f in futures]
    assert len(drafter.seen) == len(CHAT_PROMPTS)
    for tokens, chunks in drafter.seen.values():
        features = torch.cat(chunks).float()
        assert features.shape == (len(tokens) - 1, 3 * 576)  # one per committed token but the last
        assert torch.allclose(features, fused_features(target, tokens[:-1]), atol=0.05, rtol=0.01)
    assert all(r.finish_reason in ("stop", "length") for r in results)


@pytest.mark.parametrize("verify", ["tree", "counterfactual"])
def test_eagle_beside_lookup_drafters_reproduces_plain_greedy_decoding(target, trained, plain, verify):
    pool = build_drafters(["ngram", "suffix", NO_DRAFT]) | {"eagle": EagleProposer(trained[0])}
    engine = SpeculativeEngine(target, pool, policy="metasd-ucb-cost-warm", verify=verify)
    for index in (0, 2):
        assert engine.generate(messages=CHAT_PROMPTS[index], sampling=GREEDY).token_ids == plain[index].token_ids


def test_sampled_drafts_follow_the_q_the_drafter_sends(target, trained):
    drafter = EagleProposer(trained[0], q_top_n=8)
    prompt = target.encode(messages=CHAT_PROMPTS[1])
    sampling = SamplingParams(temperature=0.7, top_k=8, seed=3)
    first = drafter.propose("r", prompt, 1, sampling, fused_features(target, prompt[:-1]))
    q = dict(zip(first.q[0].ids, first.q[0].probs))
    counts = dict.fromkeys(q, 0)
    draws = 4000
    for _ in range(draws):  # the same context each time: the head's distribution does not change
        (token,) = drafter.propose("r", [], 1, sampling).token_ids
        counts[token] += 1
    assert 0.5 * sum(abs(counts[t] / draws - p) for t, p in q.items()) < 0.03
    assert sum(q.values()) == pytest.approx(1.0, abs=1e-5) and len(q) <= 8


def emitted_by_tree_verification(drafter, sampling, draft_sampling, p_first, p_second, draws, seed=0):
    """Each draw: the drafter's tree for the same context (drafted under `draft_sampling`), verified by
    recursive rejection against a target whose p is p_first at the root and p_second below it.
    -> (first emitted tokens' frequencies, second emitted tokens' frequencies) over the target vocabulary."""
    vocab = len(p_first)
    first, second = np.zeros(vocab), np.zeros(vocab)
    generator = torch.Generator().manual_seed(seed)
    p = torch.stack([p_first, p_second])  # the target's warped distributions: row 0 the root, row 1 below it
    for _ in range(draws):
        chains = drafter.propose("r", [], 2, draft_sampling).chains()
        drafts = [c.token_ids for c in chains]
        tree = DraftTree.build(drafts)
        rows = p[[0] + [1] * tree.size]
        emitted = verify_tree(tree, [c.q for c in chains], drafts, rows, sampling, generator, p=rows).token_ids
        first[emitted[0]] += 1
        if len(emitted) > 1:
            second[emitted[1]] += 1
    return first / first.sum(), second / max(second.sum(), 1)


def test_sampled_draft_trees_verified_by_recursive_rejection_emit_the_targets_distribution(target, trained):
    """Three independent chains a round; the target's p is far from the head's q (its ranking reversed,
    and a token the head never drafts), so only drafts that are true draws from the q they send keep
    the output distributed as p. A greedy tree (top tokens, not draws) fails the same check. The prompt
    is one the head never trained on, so its q is spread (where q is nearly one token, its top tokens
    are nearly draws from it and no check tells them apart)."""
    drafter = EagleProposer(trained[0], q_top_n=5, sampled_chains=3)
    prompt = target.encode(messages=[{"role": "user", "content": "Tell me about the moon."}])
    sampling = SamplingParams(temperature=1.0, seed=5)
    first = drafter.propose("r", prompt, 2, sampling, fused_features(target, prompt[:-1]))
    assert len(first.chains()) == 3 and all(len(c.token_ids) == 2 for c in first.chains())
    assert max(first.q[0].probs) < 0.7
    ids = list(first.q[0].ids)
    vocab = target.vocab_size
    p_first, p_second = torch.zeros(vocab), torch.zeros(vocab)
    p_first[ids] = torch.tensor(sorted(first.q[0].probs)) * 0.8  # the head's least likely token the target's most likely
    p_first[next(t for t in range(vocab) if t not in ids)] = 0.2
    p_second[list(first.q[1].ids)[:3]] = torch.tensor([0.2, 0.3, 0.5])
    first_freq, second_freq = emitted_by_tree_verification(drafter, sampling, sampling, p_first, p_second, 2000)
    assert 0.5 * np.abs(first_freq - p_first.numpy()).sum() < 0.04
    assert 0.5 * np.abs(second_freq - p_second.numpy()).sum() < 0.06
    greedy_tree = emitted_by_tree_verification(drafter, sampling, SamplingParams(max_tokens=32), p_first, p_second, 500)[0]
    assert 0.5 * np.abs(greedy_tree - p_first.numpy()).sum() > 0.1


def test_a_sampled_request_verifies_the_heads_independent_chains_as_a_tree_and_is_reproducible_from_its_seed(
        target, trained):
    pool = build_drafters(["ngram", NO_DRAFT]) | {"eagle": EagleProposer(trained[0])}
    engine = SpeculativeEngine(target, pool, policy="fixed:eagle", verify="tree")
    sampling = SamplingParams(max_tokens=24, temperature=0.8, seed=11)
    runs = [engine.generate(messages=CHAT_PROMPTS[0], sampling=sampling) for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and len(runs[0].token_ids) == 24
    assert runs[0].summary["num_accepted_draft_tokens"] > 0


def test_a_head_loaded_as_the_pool_loads_it_drafts_the_same_tokens(target, trained):
    head, _, out = trained
    pooled = build_drafters(["eagle"], target="smollm2-135m", eagle_head=str(out))["eagle"]
    prompt = target.encode(messages=CHAT_PROMPTS[0])
    features = fused_features(target, prompt[:-1])
    drafts = [d.propose("r", prompt, 5, GREEDY, features).token_ids for d in (EagleProposer(head), pooled)]
    assert drafts[0] == drafts[1] and len(drafts[0]) == 5


def test_a_session_without_its_features_drafts_nothing(target, trained):
    drafter = EagleProposer(trained[0])
    assert drafter.propose("r", target.encode(messages=CHAT_PROMPTS[0]), 5, GREEDY).token_ids == ()


def test_eagle_for_a_target_without_a_head_is_refused_naming_drafters_and_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    with pytest.raises(InvalidRequestError) as err:
        build_drafters(["eagle"], target="another-target")
    assert err.value.field == "drafters" and "train-eagle" in str(err.value)


def test_a_tiny_head_builds_end_to_end_from_a_generated_corpus_shard_and_drafts_losslessly(target, plain, tmp_path,
                                                                                         monkeypatch):
    """What `make eagle` does, small: a corpus shard generated through the batch scheduler, then the
    recipe (features, training, manifest) into a head the pool loads and the engine drafts with."""
    from tests.conftest import isolated_cache

    isolated_cache(monkeypatch, tmp_path / "cache")
    corpus = tmp_path / "corpus"
    (report,) = build_shards(target, [0], corpus, max_new_tokens=24, progress=False, shard_jobs=4)
    records = read_shard(shard_path(corpus, 0))
    assert report["requests"] == len(records) >= 4 and all(r.output_ids for r in records)
    assert build_shards(target, [0], corpus, progress=False, shard_jobs=4) == []  # a present shard is kept
    manifest = build_eagle(target, tmp_path / "head", corpus_dir=corpus, epochs=2, vocabulary=4096, progress=False)
    assert manifest["recipe"]["corpus"]["requests"] == len(records) and manifest["positions"] > 0
    assert len(manifest["heldout_agreement_by_depth"]) == 3 and manifest["vocabulary_coverage"] > 0.5
    pooled = build_drafters(["eagle", NO_DRAFT], target="smollm2-135m", eagle_head=str(tmp_path / "head"))
    engine = SpeculativeEngine(target, pooled, policy="fixed:eagle")
    assert engine.generate(messages=CHAT_PROMPTS[0], sampling=GREEDY).token_ids == plain[0].token_ids


def test_the_bench_reports_the_heads_vocabulary_share_of_plain_decodings_tokens(trained, monkeypatch, tmp_path):
    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    shutil.copytree(trained[2], eagle_dir("smollm2-135m"))
    vocabulary = saved_head_ids(trained[2]).tolist()
    inside, outside = vocabulary[:3], next(t for t in range(49152) if t not in set(vocabulary))
    report = eagle_head_params("smollm2-135m", [inside, [outside]])["eagle_head"]
    assert report["vocabulary_coverage"] == 0.75 and report["path"] == str(eagle_dir("smollm2-135m"))
