"""The `specfleet` command: generate prints the documented JSON, bench writes the documented report
(peers included, their output checked against plain decoding) and charts,
bad input exits 2 naming the field."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.model
CLI = [sys.executable, "-m", "deploy.cli"]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(CLI + list(args), capture_output=True, text=True, timeout=600)


def test_generate_json_prints_the_documented_fields_and_the_tokens_of_plain_decoding():
    messages = json.dumps([{"role": "user", "content": "List three colours of the rainbow."}])
    spec = run_cli("generate", "--messages", messages, "--max-tokens", "20", "--json")
    plain = run_cli("generate", "--messages", messages, "--max-tokens", "20", "--json", "--no-spec")
    assert spec.returncode == 0, spec.stderr
    out = json.loads(spec.stdout)
    assert set(out) == {"text", "token_ids", "finish_reason", "stats"}
    assert 0 < len(out["token_ids"]) <= 20 and out["finish_reason"] in ("stop", "length")
    assert "mean_acceptance_length" in out["stats"] and "per_drafter" in out["stats"]
    assert out["token_ids"] == json.loads(plain.stdout)["token_ids"]


@pytest.mark.parametrize(
    "args, field",
    [
        (["--prompt", "hi", "--temperature", "-1"], "temperature"),
        (["--prompt", "hi", "--top-p", "0"], "top_p"),
        (["--prompt", "hi", "--max-tokens", "0"], "max_tokens"),
        (["--prompt", "hi", "--policy", "nope"], "policy"),
        (["--prompt", "hi", "--drafters", "ngram,nope"], "drafters"),
        (["--messages", "[not json"], "messages"),
    ],
)
def test_generate_rejects_bad_input_naming_the_field(args, field):
    done = run_cli("generate", *args)
    assert done.returncode == 2
    assert f"error: {field}:" in done.stderr


@pytest.mark.parametrize("args, field", [(["--epochs", "0"], "epochs"), (["--vocabulary", "1"], "vocabulary"),
                                         (["--max-minutes", "0"], "max_minutes"), (["--shards", "a-b"], "shards")])
def test_train_eagle_rejects_bad_input_naming_the_field_before_loading_anything(args, field, tmp_path):
    done = run_cli("train-eagle", "--out", str(tmp_path / "head"), *args)
    assert done.returncode == 2 and f"error: {field}:" in done.stderr
    assert not (tmp_path / "head").exists()


def test_eagle_corpus_rejects_bad_shards_naming_the_field(tmp_path):
    done = run_cli("eagle-corpus", "--shards", "3,x", "--out", str(tmp_path / "corpus"))
    assert done.returncode == 2 and "error: shards:" in done.stderr and not (tmp_path / "corpus").exists()


def test_eagle_without_a_head_for_the_target_is_an_error_naming_drafters(tmp_path):
    from actors.models import cache_root

    (tmp_path / "models").symlink_to(cache_root() / "models")
    other = tmp_path / "another-target"  # the embedded target under another name: no head is built or shipped for it
    other.symlink_to(cache_root() / "models" / "smollm2-135m")
    done = subprocess.run([sys.executable, "-m", "deploy.cli", "generate", "--prompt", "hi", "--drafters", "ngram,eagle",
                           "--model", str(other)],
                          capture_output=True, text=True, timeout=600, env=os.environ | {"SPECFLEET_CACHE": str(tmp_path)})
    assert done.returncode == 2 and "error: drafters:" in done.stderr and "train-eagle" in done.stderr


def test_bench_writes_the_report_schema(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        json.dumps({"id": "a", "task": "code", "messages": [{"role": "user", "content": "Write hello world in C."}]})
        + "\n" + json.dumps({"id": "b", "task": "chat", "split": "test", "prompt": "Once upon a time"}) + "\n")
    out = tmp_path / "bench.json"
    done = run_cli("bench", "--prompts", str(prompts), "--max-tokens", "12", "--runs", "peer:hf-generate,single:*,policy:metasd-ucb",
                   "--out", str(out), "--no-progress", "--trace-prompt", "b", "--no-cut")
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert report["params"]["max_tokens"] == 12 and report["params"]["temperature"] == 0.0
    assert report["params"]["cut_drafts"] is False  # --no-cut: every drafted token verified
    assert report["params"]["splits"] == ["dev", "test"]  # a prompt without a split is dev
    assert "split dev and test" in out.with_suffix(".md").read_text()
    names = [r["name"] for r in report["runs"]]
    assert names == ["ar", "peer:hf-generate", "single:ngram", "single:suffix", "single:hierarchy", "policy:metasd-ucb",
                     "oracle"]
    assert report["summary"]["best_policy"] == "policy:metasd-ucb" and report["summary"]["all_lossless"]
    assert report["trace"]["prompt"] == "b" and len(report["trace"]["runs"]["policy:metasd-ucb"]) > 0
    for chart in ("bench.speedup.png", "bench.drafters.png"):
        assert (tmp_path / chart).read_bytes().startswith(b"\x89PNG")
        assert f"]({chart})" in out.with_suffix(".md").read_text()
    for row in report["runs"]:
        assert {"name", "tokens", "seconds", "tokens_per_s", "speedup_vs_ar", "lossless",
                "mean_accepted_length", "per_task"} <= set(row)
        assert row["lossless"] is True
        assert set(row["per_task"]) == {"code", "chat"}
    assert report["runs"][0]["speedup_vs_ar"] == 1.0 and report["runs"][0]["mean_accepted_length"] is None
    assert out.with_suffix(".md").read_text().startswith("| run |")


def test_bench_rejects_a_split_with_no_prompts_and_a_prompt_with_an_unknown_split(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "task": "chat", "prompt": "Hello"}) + "\n")
    done = run_cli("bench", "--prompts", str(prompts), "--split", "test", "--no-progress")
    assert done.returncode == 2 and "error: split:" in done.stderr
    prompts.write_text(json.dumps({"id": "a", "task": "chat", "split": "holdout", "prompt": "Hello"}) + "\n")
    done = run_cli("bench", "--prompts", str(prompts), "--no-progress")
    assert done.returncode == 2 and "error: prompts: line 1: split must be one of dev, test" in done.stderr


def test_the_shipped_test_sets_are_test_split_and_the_development_set_is_dev():
    from deploy.bench.prompts import MIXED_PROMPTS, MIXED_TEST_PROMPTS, STYLES_TEST_PROMPTS, load_prompts

    mixed, mixed_test, styles = (load_prompts(p) for p in (MIXED_PROMPTS, MIXED_TEST_PROMPTS, STYLES_TEST_PROMPTS))
    assert {p.split for p in mixed} == {"dev"} and {p.split for p in mixed_test + styles} == {"test"}
    assert {p.task for p in mixed_test} == {p.task for p in mixed}  # the development set's tasks, new prompts
    assert len(styles) >= 30 and not {p.task for p in styles} & {p.task for p in mixed}  # styles not used before
    texts = {json.dumps(p.messages) for p in mixed}
    assert not any(json.dumps(p.messages) in texts for p in mixed_test + styles)


def test_bench_rejects_a_run_that_matches_nothing(tmp_path):
    done = run_cli("bench", "--runs", "single:telepathy", "--limit", "1", "--no-progress")
    assert done.returncode == 2 and "error: runs:" in done.stderr


def test_serve_listens_for_grpc_on_port_9000_unless_told_otherwise():
    from deploy.cli import build_parser

    assert build_parser().parse_args(["serve"]).grpc_port == 9000
    assert build_parser().parse_args(["serve", "--grpc-port", "9123"]).grpc_port == 9123


def test_recycling_prior_builds_a_table_with_its_manifest_that_the_pool_then_drafts_from(tmp_path):
    from actors.models import cache_root
    from actors.recycling_table import EMPTY, load_prior

    (tmp_path / "models").symlink_to(cache_root() / "models")
    env = os.environ | {"SPECFLEET_CACHE": str(tmp_path)}
    done = subprocess.run(CLI + ["recycling-prior", "--limit", "4", "--no-progress"], capture_output=True, text=True,
                          timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    prior = load_prior(tmp_path / "recycling" / "smollm2-135m")  # where the pool looks first
    manifest = prior.manifest
    assert manifest["target"] == "smollm2-135m" and manifest["k"] == 8 and manifest["corpus"]["examples"] == 4
    assert len(manifest["model_sha256"]) == len(manifest["tokenizer_sha256"]) == 64
    assert 0 < manifest["rows"] == int((prior.ids[:, 0] != EMPTY).sum()) < prior.vocab_size
    rows = prior.ids[:, 0] != EMPTY
    assert (prior.probs[rows, 0] >= prior.probs[rows, 1]).all()  # successors best first
    bad = run_cli("recycling-prior", "--limit", "0")
    assert bad.returncode == 2 and "error: limit:" in bad.stderr


def test_the_spec_bench_development_half_ships_with_its_six_tasks_in_the_dev_split():
    from deploy.bench.prompts import PROMPTS_DIR, load_prompts

    prompts = load_prompts(PROMPTS_DIR / "spec_bench_dev.jsonl")
    assert len(prompts) == 240 and {p.split for p in prompts} == {"dev"}
    assert {p.task for p in prompts} == {"mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"}
    assert (PROMPTS_DIR / "spec_bench.LICENSE").is_file() and "Apache" in (PROMPTS_DIR / "spec_bench.md").read_text()


def test_bench_rejects_a_repeat_out_of_range_naming_it_before_loading_the_model():
    done = run_cli("bench", "--repeat", "0", "--runs", "ar")
    assert done.returncode == 2 and "error: repeat:" in done.stderr
