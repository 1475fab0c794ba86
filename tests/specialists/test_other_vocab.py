"""The drafter of another vocabulary built here (deploy/specialists/other_vocab.py): a tiny build
from the target's corpus learns, its tokenizer is not the target's, and the pool, the bandit, the
bench, the service's config and a drafter actor take `othervocab` like any drafter, losslessly."""
from __future__ import annotations

import pytest

from actors.sampling import SamplingParams

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def built(target, tmp_path_factory):
    from actors.specialists import OTHER_VOCAB
    from deploy.specialists.eagle_corpus import load_corpus
    from deploy.specialists.other_vocab import build_other_vocab
    from tests.conftest import link_converted_models

    root = tmp_path_factory.mktemp("specfleet-cache")
    link_converted_models(root)
    examples = load_corpus(target, shards=[0])[0][:18]
    meta = build_other_vocab(target, examples, root / "specialists" / OTHER_VOCAB, vocabulary=512, epochs=2, batch_size=8)
    return root, meta


def test_a_tiny_build_learns_over_a_vocabulary_of_its_own(target, built):
    from transformers import AutoTokenizer

    root, meta = built
    # 17 answers trained on (one held out): 3 batches of 8, 2 epochs
    assert meta["vocabulary"] == 512 and meta["num_layers"] == 2 and meta["steps"] == 6
    assert meta["last_epoch_loss"] < meta["first_epoch_loss"]
    tokenizer = AutoTokenizer.from_pretrained(root / "specialists" / "othervocab")
    text = "Write a Python function that returns the squares of a list."
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.encode(text, add_special_tokens=False) != target.tokenizer.encode(text, add_special_tokens=False)


def test_the_pool_the_bench_and_a_drafter_actor_take_it_losslessly(target, built, monkeypatch):
    from actors.cross_vocab import CrossVocabularyProposer
    from actors.pool import pool_drafters
    from cluster.drafter_actor import DrafterActor, DrafterSpec
    from deploy.bench.engines import make_engine
    from deploy.bench.runs import expand_runs
    from tests.conftest import CHAT_PROMPTS, plain_text

    monkeypatch.setenv("SPECFLEET_CACHE", str(built[0]))
    assert pool_drafters("specialists")[-1] == "othervocab"
    assert expand_runs("single:othervocab", ["ngram", "othervocab", "none"]) == ["ar", "single:othervocab"]
    engine = make_engine("policy:metasd-ucb-cost-warm@tree", target, ["othervocab", "ngram", "none"], k=7)  # as the bench builds it
    drafter = engine.coordinator.drafters["othervocab"]
    assert isinstance(drafter, CrossVocabularyProposer) and drafter.model_free is False
    result = engine.generate(messages=CHAT_PROMPTS[0], sampling=SamplingParams(max_tokens=16))
    assert result.text == plain_text(target, CHAT_PROMPTS[0], 16)

    from deploy.config import ServiceConfig
    from deploy.service.app import with_pool

    args = {"drafters": [{"name": "ngram", "kind": "ngram"}, {"name": "none", "kind": "none"}], "policy": "metasd-ucb"}
    served = ServiceConfig.model_validate(with_pool(args, "specialists")).drafters
    assert [(d.name, d.kind) for d in served][-1] == ("othervocab", "othervocab")  # the service's pool takes it
    actor = DrafterActor(DrafterSpec("othervocab", "othervocab"), target_vocab_size=target.vocab_size)
    assert actor.kind() == {"model_free": False, "needs_features": False}
    assert len(actor.propose("r", target.encode(messages=CHAT_PROMPTS[1]), 4, SamplingParams(max_tokens=8)).token_ids) == 4
