"""Regret against each request's best fixed arm, on hand-built rows: the time a per-request oracle
saves, rounds off the best arm, rounds on an arm slower than plain decoding (no model, no Ray)."""
import pytest

from deploy.bench import BenchPrompt, Sample, render_table
from deploy.bench.regret import request_regret
from deploy.bench.report import run_row, summarize

PROMPTS = [BenchPrompt("a", "code", prompt="a"), BenchPrompt("b", "chat", prompt="b")]
IDS = {"a": [1, 2], "b": [3, 4]}


def row(name: str, seconds: dict[str, float], rounds: dict[str, dict[str, int]] | None = None, ar: dict | None = None):
    samples = [(p, Sample(IDS[p.id], seconds[p.id], 1, {d: {"steps": n} for d, n in (rounds or {}).get(p.id, {}).items()},
                          0.0, 0.0)) for p in PROMPTS]
    return run_row(name, samples, IDS, ar)


def test_a_policy_that_always_picks_each_requests_best_arm_has_no_regret():
    ar = row("ar", {"a": 4.0, "b": 2.0})
    arms = {"ngram": row("single:ngram", {"a": 2.0, "b": 3.0}, ar=ar), "none": ar}
    policy = row("policy:p", {"a": 2.0, "b": 2.0}, {"a": {"ngram": 5}, "b": {"none": 4}}, ar)
    regret = request_regret(policy, arms)
    assert regret == {"seconds_lost_share": 0.0, "vs_request_oracle": 1.0, "rounds_off_best": 0.0,
                      "rounds_dominated": 0.0, "prompts": 2}


def test_rounds_on_the_wrong_arm_count_as_off_best_and_a_slower_than_plain_arm_as_dominated():
    ar = row("ar", {"a": 4.0, "b": 2.0})
    arms = {"ngram": row("single:ngram", {"a": 2.0, "b": 3.0}, ar=ar), "none": ar}
    # on b, ngram (3 s alone) is slower than plain decoding (2 s): its 3 rounds there are dominated
    policy = row("policy:p", {"a": 3.0, "b": 3.0}, {"a": {"ngram": 3, "none": 1}, "b": {"ngram": 3, "none": 1}}, ar)
    regret = request_regret(policy, arms)
    assert regret["seconds_lost_share"] == pytest.approx((6.0 - 4.0) / 6.0, abs=1e-4)
    assert regret["vs_request_oracle"] == pytest.approx(4.0 / 6.0, abs=1e-4)
    assert regret["rounds_off_best"] == pytest.approx(4 / 8) and regret["rounds_dominated"] == pytest.approx(3 / 8)


def test_a_tree_round_is_off_best_and_unrated_and_a_prompt_without_every_arm_is_skipped():
    ar = row("ar", {"a": 4.0, "b": 2.0})
    partial = run_row("single:suffix", [(PROMPTS[0], Sample(IDS["a"], 1.0, 1, {}, 0.0, 0.0))], IDS, ar)
    arms = {"suffix": partial, "none": ar}
    policy = row("policy:p@tree", {"a": 2.0, "b": 2.0}, {"a": {"ngram+suffix": 2, "suffix": 2}}, ar)
    regret = request_regret(policy, arms)
    assert regret["prompts"] == 1 and regret["rounds_off_best"] == 0.5 and regret["rounds_dominated"] == 0.0


def test_the_summary_and_its_table_report_each_policys_regret_with_plain_decoding_as_the_no_draft_arm():
    ar = row("ar", {"a": 4.0, "b": 2.0})
    rows = [ar, row("single:ngram", {"a": 2.0, "b": 3.0}, ar=ar),
            row("policy:p", {"a": 3.0, "b": 2.0}, {"a": {"none": 2}, "b": {"none": 2}}, ar)]
    summary = summarize(rows)
    assert summary["regret"]["policy:p"]["rounds_off_best"] == 0.5  # none on a (ngram was best), none on b (best)
    table = render_table({"model": "m", "runs": rows, "summary": summary, "params": {"prompts": 2, "max_tokens": 2}})
    assert "| policy:p | 20.0% | 0.800x | 50.0% | 0.0% |" in table
