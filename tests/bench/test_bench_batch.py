"""A bench `batch:` run: the engine's batch scheduler in a process of its own, swept at every
concurrency level after the in-process runs; each level's row is lossless, a throughput row with
its concurrency, and its requests were verified in batches (rounds fewer than tokens)."""
import pytest

from actors.errors import InvalidRequestError
from deploy.bench.prompts import BenchPrompt
from deploy.bench.runs import expand_runs, run_bench

pytestmark = pytest.mark.model
PROMPTS = [BenchPrompt("c1", "code", prompt="def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"),
           BenchPrompt("t1", "chat", messages=[{"role": "user", "content": "Name three colours."}]),
           BenchPrompt("t2", "chat", messages=[{"role": "user", "content": "Count from one to five in words."}])]


def test_a_batch_run_is_swept_at_every_level_in_its_own_process_and_is_lossless(target):
    # every drafted token verified (no cost cut, which on a slow machine may verify none at c3): drafts get accepted
    report = run_bench(target, PROMPTS, runs="ar,batch:fixed:ngram", max_tokens=24, drafters="ngram,none",
                       concurrency="1,3", progress=False, cut_drafts=False)
    rows = {row["name"]: row for row in report["runs"]}
    assert set(rows) >= {"ar", "batch:fixed:ngram@c1", "batch:fixed:ngram@c3"}
    for level in (1, 3):
        row = rows[f"batch:fixed:ngram@c{level}"]
        assert row["lossless"] is True and row["concurrency"] == level and row["tokens"] == rows["ar"]["tokens"]
        assert row["mean_accepted_length"] > 1.0  # drafts were accepted: fewer rounds than tokens
    assert report["params"]["concurrency"] == [1, 3]


def test_batch_runs_expand_like_policy_runs_and_refuse_a_model_drafter():
    assert expand_runs("batch:metasd-ucb@tree,serve:metasd-ucb", ["ngram", "none"]) == \
        ["ar", "batch:metasd-ucb@tree", "serve:metasd-ucb"]
    with pytest.raises(InvalidRequestError) as err:
        expand_runs("batch:metasd-ucb", ["ngram", "hf", "none"])
    assert err.value.field == "runs"


def test_a_batch_run_whose_process_fails_says_so_and_whether_its_answer_was_written(tmp_path):
    from deploy.bench.batch_run import BatchRun

    run = BatchRun("fixed:ngram", str(tmp_path / "no-such-model"), ["ngram", "none"], k=4)  # a path: no hub lookup
    with pytest.raises(RuntimeError, match="was not written"):
        run.sweep(PROMPTS[:1], max_tokens=4, concurrency=1)
