"""Bench shards over disjoint tasks merge into the report the whole bench gives: totals, ratios,
rounds, drafting cost, the oracle, the summary's intervals; shards that differ are refused, the
field named (hand-built samples: no model, no Ray)."""
import random

import pytest

from actors.errors import InvalidRequestError
from deploy.bench import BenchPrompt, Sample
from deploy.bench.merge import main, merge_reports
from deploy.bench.report import oracle_row, run_row, summarize

TASKS = ("code", "math", "qa", "translation")
PROMPTS = [BenchPrompt(f"{task}-{i}", task, prompt=f"{task} {i}", split="test") for task in TASKS for i in range(3)]
RUNS = ("ar", "single:ngram", "single:retrieval-math", "policy:metasd-ucb-cost-warm@tree")


def _samples(run: str, prompts: list[BenchPrompt]) -> list[tuple[BenchPrompt, Sample]]:
    out = []
    for p in prompts:
        tokens = [7] * random.Random(p.id).randint(40, 64)  # every run answers alike: lossless
        rng = random.Random(f"{run}/{p.id}")  # the same sample for a prompt whichever bench holds it
        rounds = len(tokens) if run == "ar" else rng.randint(20, 40)
        drafter = run.split(":")[-1].split("@")[0]
        per_drafter = {} if run == "ar" else {drafter: {"steps": rounds, "drafted": 3 * rounds, "accepted": rounds}}
        out.append((p, Sample(tokens, rng.uniform(1.0, 3.0), rounds, per_drafter, rng.uniform(0.01, 0.1),
                              rng.uniform(0.5, 2.0))))
    return out


def _report(prompts: list[BenchPrompt]) -> dict:
    """What run_bench returns for these prompts (in-process runs only)."""
    results = {run: _samples(run, prompts) for run in RUNS}
    ar_ids = {p.id: x.token_ids for p, x in results["ar"]}
    rows = [run_row("ar", results["ar"], ar_ids, None)]
    rows += [run_row(run, results[run], ar_ids, rows[0]) for run in RUNS[1:]]
    rows.append(oracle_row(rows))
    params = {"max_tokens": 64, "temperature": 0.0, "k": 7, "drafters": ["ngram"], "prompts": len(prompts),
              "splits": ["test"], "concurrency": [1], "cut_drafts": True}
    return {"model": "smollm2-135m", "params": params, "runs": rows, "summary": summarize(rows), "trace": {}}


def _shards() -> tuple[dict, dict, dict]:
    whole = _report(PROMPTS)
    first = _report([p for p in PROMPTS if p.task in ("code", "qa")])
    second = _report([p for p in PROMPTS if p.task in ("math", "translation")])
    return whole, first, second


def test_two_shards_merge_into_the_figures_of_the_whole_bench():
    whole, first, second = _shards()
    merged = merge_reports([first, second])
    by_name = {row["name"]: row for row in whole["runs"]}
    assert [row["name"] for row in merged["runs"]] == [row["name"] for row in whole["runs"]]
    for row in merged["runs"]:
        expected = by_name[row["name"]]
        assert row["tokens"] == expected["tokens"]
        for key in ("seconds", "tokens_per_s", "speedup_vs_ar"):
            assert row[key] == pytest.approx(expected[key], rel=2e-3), (row["name"], key)
        assert set(row["per_task"]) == set(TASKS)
        assert row["lossless"]
    for row in merged["runs"][1:-1]:
        expected = by_name[row["name"]]
        assert row["mean_accepted_length"] == pytest.approx(expected["mean_accepted_length"], rel=2e-3)
        assert row["draft_ms_per_token"] == pytest.approx(expected["draft_ms_per_token"], rel=5e-3)
        assert row["draft_share_of_round"] == pytest.approx(expected["draft_share_of_round"], rel=5e-3)
        assert sorted(s[0] for s in row["samples"]) == sorted(s[0] for s in expected["samples"])
    assert merged["runs"][-1]["chosen"] == whole["runs"][-1]["chosen"]
    assert merged["params"]["prompts"] == len(PROMPTS) and merged["params"]["merged_shards"] == 2


def test_the_merged_summary_compares_the_policy_with_the_best_single_drafter_and_the_oracle_as_the_whole_does():
    whole, first, second = _shards()
    summary, expected = merge_reports([first, second])["summary"], whole["summary"]
    for key in ("vs_ar", "vs_best_single", "vs_oracle"):
        assert summary[key] == pytest.approx(expected[key], rel=2e-3)
    assert summary["best_single_name"] == expected["best_single_name"]
    for key in ("vs_best_single_ci95", "vs_oracle_ci95"):  # the bootstrap sees the same prompts (other order)
        assert summary["uncertainty"][key] == pytest.approx(expected["uncertainty"][key], abs=0.02)


def test_shards_that_repeat_a_task_are_refused_naming_tasks():
    _, first, _ = _shards()
    with pytest.raises(InvalidRequestError) as err:
        merge_reports([first, first])
    assert err.value.field == "tasks"


@pytest.mark.parametrize("field, change", [("max_tokens", {"max_tokens": 128}), ("k", {"k": 5})])
def test_shards_run_with_other_settings_are_refused_naming_the_setting(field, change):
    _, first, second = _shards()
    second["params"].update(change)
    with pytest.raises(InvalidRequestError) as err:
        merge_reports([first, second])
    assert err.value.field == field


def test_shards_with_other_runs_or_a_single_report_are_refused():
    _, first, second = _shards()
    second["runs"] = [row for row in second["runs"] if row["name"] != "single:ngram"]
    with pytest.raises(InvalidRequestError) as err:
        merge_reports([first, second])
    assert err.value.field == "runs"
    with pytest.raises(InvalidRequestError) as err:
        merge_reports([first])
    assert err.value.field == "reports"


def test_the_command_writes_the_merged_json_and_its_table(tmp_path, capsys):
    import json

    _, first, second = _shards()
    paths = []
    for name, report in (("a", first), ("b", second)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(report))
    main([str(p) for p in paths] + ["--out", str(tmp_path / "all.json")])
    merged = json.loads((tmp_path / "all.json").read_text())
    assert merged["params"]["prompts"] == len(PROMPTS)
    assert "| oracle |" in (tmp_path / "all.md").read_text() and "Best policy" in capsys.readouterr().out
