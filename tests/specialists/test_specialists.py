"""Task specialists: training prompts, the retrieval datastore and the corpus it is built from, a
tiny distillation end to end (saved as its difference from the target), the specialists the
repository ships (within their size budget, lossless), a user's own specialist from a file, and
the specialist pool's names and errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from actors.errors import InvalidRequestError
from actors.retrieval import SEPARATOR, RetrievalProposer, TokenDatastore
from actors.sampling import SamplingParams

PROMPTS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prompts"
GREEDY = SamplingParams(max_tokens=8)
SHIPPED_TASKS = ("code", "math", "translation", "chat", "qa")


def _texts(path: Path) -> set[str]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["messages"][-1]["content"] if "messages" in row else row["prompt"] for row in rows}


def test_training_prompts_never_repeat_a_bench_prompt_and_are_distinct():
    from deploy.specialists.tasks import SPECIALIST_TASKS, training_prompts

    bench = set().union(*(_texts(p) for p in PROMPTS_DIR.glob("*.jsonl")))
    for task in SPECIALIST_TASKS:
        texts = [m[0]["content"] for m in training_prompts(task, 160)]
        assert len(set(texts)) == 160
        assert not set(texts) & bench


def test_chat_and_qa_training_prompts_leave_out_the_mixed_sets_subjects():
    from deploy.specialists.tasks import training_prompts

    bench_subjects = ["robot", "paint", "job interview", "relaxing weekend", "working from home", "ocean at night", "Australia",
                      "sky", "Pride and Prejudice", "Amazon", "weather and climate"]
    for task in ("chat", "qa"):
        for messages in training_prompts(task, 160):
            text = messages[0]["content"].lower()
            assert not [s for s in bench_subjects if s.lower() in text], text


def test_the_shipped_training_files_are_what_the_generator_writes(tmp_path):
    from deploy.specialists.tasks import SPECIALIST_TASKS, write_training_files

    write_training_files(tmp_path)
    for task in SPECIALIST_TASKS:
        assert (tmp_path / f"{task}.jsonl").read_text() == (PROMPTS_DIR / "train" / f"{task}.jsonl").read_text()


def test_an_unknown_task_is_an_error_naming_task():
    from deploy.specialists.tasks import training_prompts

    with pytest.raises(InvalidRequestError, match="task"):
        training_prompts("poetry", 3)


def test_datastore_match_range_finds_exactly_the_suffixes_that_start_with_the_pattern():
    rng = np.random.default_rng(0)
    sequences = [rng.integers(0, 5, size=int(rng.integers(5, 40))).tolist() for _ in range(30)]
    store = TokenDatastore.build(sequences, depth=6)
    for pattern in ([1], [2, 3], [0, 0, 1], [4, 4, 4, 4]):
        lo, hi = store.match_range(pattern)
        found = sorted(int(p) for p in store.order[lo:hi])
        expected = [i for i in range(len(store)) if store.tokens[i : i + len(pattern)].tolist() == pattern]
        assert found == expected


def test_the_longest_matching_tail_is_the_one_trying_every_length_finds():
    rng = np.random.default_rng(1)
    store = TokenDatastore.build([rng.integers(0, 4, size=int(rng.integers(3, 30))).tolist() for _ in range(20)], depth=8)
    for _ in range(300):
        context = rng.integers(0, 5, size=int(rng.integers(1, 12))).tolist()
        min_match, max_match = int(rng.integers(1, 4)), int(rng.integers(3, 10))
        occurs = [m for m in range(min_match, min(max_match, len(context), 8) + 1)
                  if len(range(*store.match_range(context[len(context) - m :])))]
        longest = max(occurs, default=0)
        assert store.longest_tail(context, min_match, max_match)[0] == longest


def test_datastore_drafts_the_most_frequent_continuation_of_the_longest_match():
    store = TokenDatastore.build([[1, 2, 3, 4, 5], [9, 2, 3, 4, 7], [2, 3, 4, 5, 6]], depth=4)
    assert store.continuation([8, 2, 3, 4], k=1, min_match=1, max_match=4) == (5,)  # 5 follows 2 3 4 twice, 7 once
    assert store.continuation([0, 9, 2], k=3, min_match=1, max_match=4) == (3, 4, 7)  # the longest tail (9 2) decides


def test_a_sequence_boundary_ends_the_draft_and_no_match_drafts_nothing():
    store = TokenDatastore.build([[1, 2, 3], [7, 8, 9]], depth=4)
    assert store.continuation([5, 2], k=5, min_match=1, max_match=4) == (3,)
    assert SEPARATOR not in store.continuation([2], k=5, min_match=1, max_match=4)
    assert store.continuation([6, 6], k=5, min_match=1, max_match=4) == ()


def test_a_corpus_saved_as_token_ids_reads_back_equal_and_its_datastore_drafts_from_it(tmp_path):
    from actors.specialists import task_datastore
    from actors.task_corpus import Example, load_corpus, save_corpus

    examples = [Example((1, 2), (3, 4)), Example((), (2, 3, 5)), Example((40_000,), ())]
    save_corpus(examples, tmp_path / "corpus.npz")
    assert load_corpus(tmp_path / "corpus.npz") == examples
    with np.load(tmp_path / "corpus.npz") as saved:
        assert saved["tokens"].dtype == np.uint16  # every id fits: two bytes a token
    save_corpus([Example((70_000,), (1,))], tmp_path / "wide.npz")
    assert load_corpus(tmp_path / "wide.npz") == [Example((70_000,), (1,))]
    store = task_datastore(tmp_path / "corpus.npz", "tiny")
    assert store.continuation([9, 1, 2], 3, 1, 3) == (3, 4)


def test_retrieval_drafter_follows_its_session_deltas_and_is_model_free():
    proposer = RetrievalProposer(TokenDatastore.build([[10, 11, 12, 13, 14, 15]], depth=4), name="retrieval-x")
    assert proposer.model_free
    assert proposer.propose("r", [1, 10, 11], 2, GREEDY).token_ids == (12, 13)
    assert proposer.propose("r", [12, 13], 5, GREEDY).token_ids == (14, 15)
    proposer.release("r")
    assert len(proposer.sessions) == 0


def test_retrieval_prefers_the_context_unless_the_datastore_matches_a_longer_tail():
    proposer = RetrievalProposer(TokenDatastore.build([[1, 2, 3, 4, 50, 51]], depth=8))
    from_datastore = proposer.propose("a", [7, 3, 4, 60, 61, 2, 3, 4], 2, GREEDY)
    assert (from_datastore.token_ids, from_datastore.source) == ((50, 51), "datastore")  # datastore: 3 tokens, context: 2
    from_context = proposer.propose("b", [2, 3, 4, 60, 61, 2, 3, 4], 2, GREEDY)
    assert (from_context.token_ids, from_context.source) == ((60, 61), "context")  # a tie goes to the context
    datastore_only = RetrievalProposer(TokenDatastore.build([[1, 2, 3, 4, 50, 51]], depth=8), context_n=None)
    assert datastore_only.propose("c", [2, 3, 4, 60, 61, 2, 3, 4], 2, GREEDY).token_ids == (50, 51)


def test_a_model_drafter_with_a_confidence_floor_stops_after_an_unsure_token():
    from actors.hf import HFModelProposer
    from tests.conftest import tiny_llama

    model = tiny_llama(vocab_size=50)
    assert len(HFModelProposer(model, min_confidence=0.0).propose("r", [1, 2, 3], 5, GREEDY).token_ids) == 5
    assert len(HFModelProposer(model, min_confidence=1.01).propose("r", [1, 2, 3], 5, GREEDY).token_ids) == 1


def test_an_empty_corpus_is_an_error_naming_corpus():
    with pytest.raises(InvalidRequestError, match="corpus"):
        TokenDatastore.build([[]])


def test_specialist_pool_errors_name_the_field(tmp_path, monkeypatch):
    from actors.pool import build_drafters, parse_drafter_names, pool_drafters

    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    with pytest.raises(InvalidRequestError, match="pool.*specfleet specialists --model other-model"):
        pool_drafters("specialists", "other-model")  # nothing built here, nothing shipped for it
    with pytest.raises(InvalidRequestError, match="pool"):
        pool_drafters("experts")
    assert parse_drafter_names("ngram,retrieval-code") == ("ngram", "retrieval-code")
    with pytest.raises(InvalidRequestError, match="drafters.*make specialists"):
        build_drafters(["retrieval-nosuchtask"])
    with pytest.raises(InvalidRequestError, match="drafters"):
        parse_drafter_names("retrieval-")


def test_a_tiny_distillation_learns_and_its_drafter_is_lossless(target, tmp_path, monkeypatch):
    """End to end on the real target: its answers -> a 1-layer drafter whose loss falls -> saved
    under the specialists root -> built as `distill-tiny` beside `retrieval-tiny` -> greedy output
    equal to plain decoding."""
    from actors.pool import build_drafters, pool_drafters
    from actors.specialists import CORPUS_FILE, specialists_root
    from actors.task_corpus import save_corpus
    from deploy.engine.engine import SpeculativeEngine
    from deploy.specialists.build import build_distilled
    from deploy.specialists.corpus import target_outputs
    from deploy.specialists.tasks import training_prompts
    from tests.conftest import CHAT_PROMPTS, isolated_cache, plain_text

    isolated_cache(monkeypatch, tmp_path)
    examples = target_outputs(target, training_prompts("code", 4), max_new_tokens=16, batch_size=4)
    assert len(examples) == 4 and all(len(e.output_ids) > 0 for e in examples)
    meta = build_distilled(target, examples, specialists_root() / "tiny" / "distill", num_layers=1, epochs=8)
    assert meta["last_epoch_loss"] < meta["first_epoch_loss"]
    assert meta["num_layers"] == 1 and 0 < meta["head_size"] < target.vocab_size
    save_corpus(examples, specialists_root() / "tiny" / CORPUS_FILE)
    assert {"retrieval-tiny", "distill-tiny"} <= set(pool_drafters("specialists"))

    drafters = build_drafters(["distill-tiny", "retrieval-tiny", "none"], target_vocab_size=target.vocab_size)
    assert drafters["distill-tiny"].model_free is False and drafters["retrieval-tiny"].model_free is True
    engine = SpeculativeEngine(target, drafters, policy="metasd-ucb", k=4, cut_drafts=False)
    messages = CHAT_PROMPTS[1]
    result = engine.generate(messages=messages, sampling=SamplingParams(max_tokens=24))
    assert result.text == plain_text(target, messages, 24)
    assert result.summary["per_drafter"]["distill-tiny"]["drafted"] > 0


def test_the_specialist_pool_joins_the_service_config_and_a_drafter_actor_builds_it(tmp_path, monkeypatch):
    from actors.specialists import CORPUS_FILE, specialists_root
    from actors.task_corpus import Example, save_corpus
    from cluster.drafter_actor import DrafterActor, DrafterSpec
    from deploy.config import ServiceConfig
    from deploy.service.app import with_pool

    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))
    save_corpus([Example((), (5, 6, 7, 8, 9))], specialists_root() / "tiny" / CORPUS_FILE)
    args = {"drafters": [{"name": "ngram", "kind": "ngram"}, {"name": "none", "kind": "none"}], "policy": "metasd-ucb"}
    assert with_pool(args, "default") == args
    config = ServiceConfig.model_validate(with_pool(args, "specialists"))
    shipped = [f"{kind}-{task}" for kind in ("retrieval", "distill") for task in SHIPPED_TASKS]
    assert [d.name for d in config.drafters] == ["ngram", "none", "suffix", "hierarchy", *sorted(
        shipped + ["retrieval-tiny"], key=lambda n: (n.startswith("distill"), n.split("-")[1]))]
    actor = DrafterActor(DrafterSpec("retrieval-tiny", "retrieval-tiny"), target_vocab_size=100)
    assert actor.kind() == {"model_free": True, "needs_features": False}
    assert actor.propose("r", [1, 6, 7], 2, GREEDY).token_ids == (8, 9)


def test_the_distill_command_writes_a_loadable_drafter_and_its_corpus(tmp_path, capsys):
    from actors.models import load_draft_model
    from actors.task_corpus import load_corpus
    from deploy.cli import main

    prompts = tmp_path / "train.jsonl"
    prompts.write_text("".join(json.dumps({"id": f"t{i}", "task": "math", "messages": [{"role": "user", "content": text}]}) + "\n"
                               for i, text in enumerate(["What is 2 + 3?", "What is 10 - 4?", "What is 6 * 7?"])))
    out = tmp_path / "drafter"
    assert main(["distill", "--task", "math", "--prompts", str(prompts), "--out", str(out),
                 "--layers", "1", "--epochs", "2", "--max-new-tokens", "8"]) == 0
    assert '"task": "math"' in capsys.readouterr().out
    meta = json.loads((out / "distill.json").read_text())
    assert meta["num_layers"] == 1 and meta["examples"] == 2 and meta["target"] == "smollm2-135m"
    assert len(load_corpus(out / "corpus.npz")) == 3
    model = load_draft_model(str(out))
    assert model.config.num_hidden_layers == 1 and model.head.weight.shape[0] == meta["head_size"]
