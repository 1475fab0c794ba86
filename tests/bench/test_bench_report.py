"""The bench report's arithmetic on hand-built samples: throughput, latency percentiles,
losslessness, the oracle, the summary, run names and their errors (no model, no Ray)."""
import pytest

from actors.errors import InvalidRequestError
from deploy.bench import BenchPrompt, Sample, expand_runs, parse_concurrency, render_table
from deploy.bench.report import is_multi_draft, oracle_row, run_row, summarize

PROMPTS = [BenchPrompt("c1", "code", prompt="a"), BenchPrompt("c2", "code", prompt="b"),
           BenchPrompt("t1", "translation", prompt="c")]
AR_IDS = {"c1": [1, 2, 3, 4], "c2": [5, 6], "t1": [7, 8, 9, 10]}
POOL = ("ngram", "suffix", "none")


def samples(seconds: dict[str, float], ids: dict[str, list[int]] = AR_IDS, rounds: int = 2):
    return [(p, Sample(ids[p.id], seconds[p.id], rounds, {"ngram": {"steps": rounds}}, 0.01, 0.1)) for p in PROMPTS]


def ar_row():
    return run_row("ar", samples({"c1": 1.0, "c2": 1.0, "t1": 2.0}, rounds=4), AR_IDS, None)


def test_the_baseline_row_follows_the_documented_schema():
    row = ar_row()
    assert row["tokens"] == 10 and row["seconds"] == 4.0 and row["tokens_per_s"] == 2.5
    assert row["speedup_vs_ar"] == 1.0 and row["mean_accepted_length"] is None and row["lossless"]
    assert row["per_task"]["code"]["tokens_per_s"] == 3.0 and row["per_task"]["code"]["mean_accepted_length"] is None


def test_a_faster_run_reports_its_speedup_per_task_and_overall():
    row = run_row("single:ngram", samples({"c1": 0.5, "c2": 0.5, "t1": 2.0}), AR_IDS, ar_row())
    assert row["speedup_vs_ar"] == pytest.approx(10 / 3 / 2.5, abs=1e-3)
    assert row["per_task"]["code"]["speedup_vs_ar"] == 2.0 and row["per_task"]["translation"]["speedup_vs_ar"] == 1.0
    assert row["mean_accepted_length"] == pytest.approx(10 / 6, abs=1e-3)


def test_a_single_drafters_acceptance_by_position_counts_the_rounds_that_drafted_that_far():
    from dataclasses import replace

    traced = [(p, replace(x, trace=(("ngram", 3, 3), ("ngram", 3, 1), ("ngram", 1, 0), ("none", 0, 0))))
              for p, x in samples({"c1": 1.0, "c2": 1.0, "t1": 1.0})]
    row = run_row("single:ngram", traced, AR_IDS, ar_row())
    # position 1: 2 of 3 rounds; position 2: 1 of 2; position 3: 1 of 2
    assert row["acceptance_by_position"] == [0.667, 0.5, 0.5]
    table = render_table({"runs": [ar_row(), row], "params": {"prompts": 3}})
    assert "| single:ngram | 0.67 | 0.50 | 0.50 |" in table
    assert "acceptance_by_position" not in run_row("policy:metasd-ucb", traced, AR_IDS, ar_row())


def test_one_different_token_makes_a_run_lossy():
    wrong = dict(AR_IDS, t1=[7, 8, 9, 11])
    assert not run_row("single:ngram", samples({"c1": 1, "c2": 1, "t1": 1}, wrong), AR_IDS, ar_row())["lossless"]


def test_a_concurrent_run_reports_throughput_over_wall_time_and_latency_percentiles():
    row = run_row("serve:x@c4", samples({"c1": 1.0, "c2": 3.0, "t1": 2.0}), AR_IDS, ar_row(), concurrency=4, wall_s=2.0)
    assert row["tokens_per_s"] == 5.0 and row["speedup_vs_ar"] == 2.0
    assert row["concurrency"] == 4 and row["wall_s"] == 2.0
    assert row["latency_p50_s"] == 2.0 and 2.9 < row["latency_p99_s"] <= 3.0
    assert "ttft_p50_s" not in row  # these samples never saw their first token


def test_a_run_that_sees_first_tokens_reports_their_percentiles_in_its_row_and_table():
    ar = ar_row()
    seen = [(p, Sample(AR_IDS[p.id], 2.0, 1, {}, 0.0, 0.0, first_token_s=t)) for p, t in zip(PROMPTS, (0.1, 0.3, 0.2))]
    row = run_row("serve:x@c4", seen, AR_IDS, ar, concurrency=4, wall_s=2.0)
    assert row["ttft_p50_s"] == 0.2 and 0.29 < row["ttft_p99_s"] <= 0.3
    table = render_table({"model": "m", "runs": [ar, row], "params": {"prompts": 3, "max_tokens": 4}})
    assert "| 2.00 | 2.00 | 0.20 | 0.30 | yes |" in table


def test_a_sweep_lists_every_run_per_concurrency_and_charts_throughput_against_it(tmp_path):
    from deploy.bench.charts import concurrency_chart

    ar = ar_row()
    rows = [ar, run_row("serve:x", samples({"c1": 1.0, "c2": 1.0, "t1": 1.0}), AR_IDS, ar)]
    rows += [run_row(f"{name}@c{c}", samples({"c1": 1.0, "c2": 1.0, "t1": 1.0}), AR_IDS, ar, concurrency=c, wall_s=wall)
             for name, c, wall in (("serve:x", 4, 1.0), ("peer:hf-batch", 1, 3.0), ("peer:hf-batch", 4, 1.5))]
    report = {"model": "m", "runs": rows, "params": {"prompts": 3, "max_tokens": 4}}
    table = render_table(report)
    assert "| peer:hf-batch@c1 | 1 | 3 | 3.3 |" in table and "| serve:x@c4 | 4 | 3 | 10.0 |" in table
    chart = concurrency_chart(report, tmp_path / "c.png")
    assert chart.stat().st_size > 0


def test_the_oracle_takes_each_tasks_best_single_drafter_and_the_summary_compares_the_best_policy():
    ar = ar_row()
    fast_code = run_row("single:ngram", samples({"c1": 0.5, "c2": 0.5, "t1": 2.0}), AR_IDS, ar)
    fast_translation = run_row("single:suffix", samples({"c1": 1.0, "c2": 1.0, "t1": 1.0}), AR_IDS, ar)
    policy = run_row("policy:p", samples({"c1": 0.5, "c2": 0.5, "t1": 1.25}), AR_IDS, ar)
    peer = run_row("peer:hf-generate", samples({"c1": 1.0, "c2": 1.0, "t1": 2.0}), AR_IDS, ar)
    oracle = oracle_row([ar, peer, fast_code, fast_translation, policy])
    assert oracle["chosen"] == {"code": "single:ngram", "translation": "single:suffix"}
    assert oracle["tokens_per_s"] == 5.0
    summary = summarize([ar, peer, fast_code, fast_translation, policy, oracle])
    assert summary["best_policy"] == "policy:p" and summary["all_lossless"]
    assert summary["vs_oracle"] == pytest.approx(0.889, abs=1e-3) and summary["vs_best_peer"] == pytest.approx(1.778, abs=1e-3)
    table = render_table({"runs": [ar, peer, fast_code, policy, oracle], "summary": summary, "params": {"prompts": 3}})
    assert "| peer:hf-generate | 2.5 | 1.00x | yes |" in table and "Best policy policy:p" in table


def test_a_bench_of_single_drafters_alone_still_compares_each_specialist_on_its_own_task():
    ar = ar_row()
    specialist = run_row("single:retrieval-code", samples({"c1": 0.5, "c2": 0.5, "t1": 2.0}, rounds=1), AR_IDS, ar)
    generic = run_row("single:ngram", samples({"c1": 0.5, "c2": 0.5, "t1": 2.0}, rounds=2), AR_IDS, ar)
    summary = summarize([ar, specialist, generic])
    assert "best_policy" not in summary and summary["all_lossless"]
    code = summary["specialists"]["single:retrieval-code"]
    assert code["task"] == "code" and code["best_other"] == "single:ngram" and code["beats_others"]
    table = render_table({"runs": [ar, specialist, generic], "summary": summary, "params": {"prompts": 3}})
    assert "No policy run; all runs lossless." in table and "| single:retrieval-code | code |" in table


def test_peers_expand_by_glob_and_the_assistant_needs_a_draft_model():
    assert expand_runs("peer:*", POOL) == ["ar", "peer:hf-generate", "peer:hf-prompt-lookup", "peer:hf-batch", "peer:hf-cb",
                                            "peer:hf-serve"]
    assert "peer:hf-assistant" in expand_runs("peer:*", POOL, has_draft_model=True)
    with pytest.raises(InvalidRequestError, match="draft-model") as err:
        expand_runs("peer:hf-assistant", POOL)
    assert err.value.field == "runs"


def test_several_serve_runs_are_one_bench_each_swept_on_its_own_service():
    assert expand_runs("serve:metasd-ucb,serve:fixed:none", POOL) == ["ar", "serve:metasd-ucb", "serve:fixed:none"]


def test_a_policy_run_can_leave_drafters_out_of_its_pool_so_one_bench_compares_with_and_without_them():
    from policy.registry import run_drafters, split_run_policy

    label = "metasd-ucb-cost-warm@tree-without-suffix+ngram"
    assert run_drafters(label, POOL) == [d for d in POOL if d not in ("suffix", "ngram")]
    assert split_run_policy(label) == ("metasd-ucb-cost-warm", "tree") and run_drafters("metasd-ucb", POOL) == list(POOL)
    assert expand_runs(f"policy:{label},serve:{label}", POOL) == ["ar", f"policy:{label}", f"serve:{label}"]


@pytest.mark.parametrize("runs", ["serve:nonsense", "batch:nonsense", "peer:vllm", "turbo:ngram", "policy:nonsense",
                                  "policy:metasd-ucb-without-eagle", "policy:metasd-ucb@tree-without-"])
def test_bad_run_lists_are_rejected_naming_runs(runs):
    with pytest.raises(InvalidRequestError) as err:
        expand_runs(runs, POOL)
    assert err.value.field in ("runs", "policy")


@pytest.mark.parametrize("levels", ["0", "1,x", "", "65"])
def test_bad_concurrency_levels_are_rejected_naming_concurrency(levels):
    with pytest.raises(InvalidRequestError) as err:
        parse_concurrency(levels)
    assert err.value.field == "concurrency"


def test_concurrency_levels_are_sorted_and_deduplicated():
    assert parse_concurrency("8,1,4,4") == (1, 4, 8)


def test_a_cost_profile_re_times_each_round_by_its_verified_positions_and_prices_larger_trees_on_its_slope(tmp_path):
    import json

    from deploy.bench.cost_profile import CostProfile

    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"device": "cuda", "plain_step_s": 0.02, "chain": {"1": 1.0, "8": 1.1, "15": 1.2}}))
    profile = CostProfile.load(path)
    # prefill (one step) + a plain round + an 8-position round with 1 ms of drafting
    assert profile.request_s([(1, 0.0), (8, 0.001)]) == pytest.approx(0.02 * (1 + 1.0 + 1.1) + 0.001)
    assert profile.forward_s(5) == pytest.approx(0.02 * 1.1)  # between sizes: the next measured one
    # beyond the profile: on from the largest along the fitted slope (0.1 plain steps per 7 positions)
    assert profile.forward_s(40) == pytest.approx(0.02 * (1.2 + 25 * 0.1 / 7))
    path.write_text("{}")
    with pytest.raises(InvalidRequestError, match="cost_profile"):
        CostProfile.load(path)


def test_a_profiled_round_charges_its_drafters_in_parallel_as_actors_on_their_own_devices(tmp_path):
    import json

    from deploy.bench.cost_profile import CostProfile
    from deploy.engine.request import GenerationResult, RoundTrace

    path = tmp_path / "gpu.json"
    path.write_text(json.dumps({"device": "cuda", "plain_step_s": 0.02, "chain": {"1": 1.0, "8": 1.0}}))
    # one round: a 4 ms coordinator call in which three drafters drafted for 1 + 1 + 1.5 ms in turn
    round_ = RoundTrace("ngram", 7, 3, 4, 0.5, draft_s=0.004, verify_s=0.03, drafter_s=0.0015, drafting_sum_s=0.0035)
    assert round_.parallel_draft_s == pytest.approx(0.0005 + 0.0015)
    sample = Sample.from_result(GenerationResult("", [1, 2, 3, 4], "length", 3, [round_]), 0.1, CostProfile.load(path))
    assert sample.profiled_s == pytest.approx(0.02 * 2 + 0.002)


def test_profiled_rows_and_the_multi_draft_summary_compare_like_with_like():
    def timed(seconds, profiled):
        return [(p, Sample(AR_IDS[p.id], seconds, 2, {}, 0.0, 0.1, profiled_s=profiled)) for p in PROMPTS]

    ar = run_row("ar", timed(1.0, 2.0), AR_IDS, None)
    one = run_row("policy:metasd-ucb", timed(0.5, 1.0), AR_IDS, ar)
    multi = run_row("policy:metasd-ucb@tree", timed(0.6, 0.8), AR_IDS, ar)
    single = run_row("single:ngram", timed(0.55, 1.1), AR_IDS, ar)  # a single drafter is a one-drafter policy too
    assert ar["profiled"]["speedup_vs_ar"] == 1.0 and one["profiled"]["speedup_vs_ar"] == 2.0
    assert multi["profiled"]["per_task"] == {"code": 2.5, "translation": 2.5}
    summary = summarize([ar, single, one, multi])
    measured, profiled = summary["multi_draft"], summary["profiled_multi_draft"]
    assert (measured["best_multi"], measured["best_one_drafter"]) == ("policy:metasd-ucb@tree", "policy:metasd-ucb")
    assert measured["ratio"] == pytest.approx(0.5 / 0.6, abs=1e-3)
    assert profiled["ratio"] == pytest.approx(1.0 / 0.8, abs=1e-3)
    # each interval resamples its own seconds: every prompt is 1.25x profiled, 0.83x measured
    assert profiled["ci95"] == pytest.approx((1.25, 1.25)) and measured["ci95"] == pytest.approx((0.833, 0.833))
    table = render_table({"runs": [ar, one, multi], "summary": summary,
                          "params": {"prompts": 3, "cost_profile": {"device": "cuda"}}})
    assert "profiled (cuda)" in table
    assert "Multi-draft (profiled): policy:metasd-ucb@tree is 1.250x policy:metasd-ucb (95% interval 1.250-1.250)" in table
    assert "| policy:metasd-ucb@tree | 2.50x | 2.50x |" in table  # the profiled per-task table


def test_a_run_is_multi_draft_when_it_verifies_the_tree_of_several_drafters():
    assert is_multi_draft("policy:metasd-ucb@tree") and is_multi_draft("policy:metasd-ucb-cost-warm@tree")
    one_drafter = ("policy:metasd-ucb", "policy:metasd-ucb@chosen", "policy:metasd-ucb-cost-warm@counterfactual", "single:ngram")
    assert not any(is_multi_draft(name) for name in one_drafter)


def test_each_row_keeps_its_per_prompt_samples():
    row = run_row("single:ngram", samples({"c1": 0.5, "c2": 0.25, "t1": 2.0}), AR_IDS, ar_row())
    assert row["samples"] == [["c1", "code", 4, 0.5], ["c2", "code", 2, 0.25], ["t1", "translation", 4, 2.0]]


def test_the_ratio_interval_is_one_against_itself_and_above_one_for_a_run_faster_on_every_prompt():
    from deploy.bench.uncertainty import ratio_interval

    ar = ar_row()
    slow = run_row("single:ngram", samples({"c1": 1.0, "c2": 1.0, "t1": 2.0}), AR_IDS, ar)
    fast = run_row("policy:p", samples({"c1": 0.8, "c2": 0.9, "t1": 1.5}), AR_IDS, ar)
    assert ratio_interval(slow, slow, [slow]) == (1.0, 1.0)
    low, high = ratio_interval(fast, slow, [slow])
    assert 1.0 < low <= fast["tokens_per_s"] / slow["tokens_per_s"] <= high


def test_the_cross_validated_oracle_is_not_lifted_by_drafters_each_lucky_on_one_prompt():
    from deploy.bench.uncertainty import cross_validated_oracle

    ar = ar_row()
    lucky_first = run_row("single:ngram", samples({"c1": 0.5, "c2": 2.0, "t1": 2.0}), AR_IDS, ar)
    lucky_second = run_row("single:suffix", samples({"c1": 2.0, "c2": 0.5, "t1": 1.0}), AR_IDS, ar)
    plain = oracle_row([ar, lucky_first, lucky_second])
    cv = cross_validated_oracle([lucky_first, lucky_second])
    # each code prompt is timed with the drafter that was fast on the other one: 2 s each
    assert cv["chosen"]["code"] == ["single:suffix", "single:ngram"]
    assert cv["chosen"]["translation"] == ["single:suffix"]  # one prompt: the best drafter overall
    assert cv["tokens_per_s"] == pytest.approx(10 / 5.0) and plain["tokens_per_s"] > cv["tokens_per_s"]


def test_the_summary_reports_the_intervals_and_the_cross_validated_oracle():
    ar = ar_row()
    single = run_row("single:ngram", samples({"c1": 0.5, "c2": 0.5, "t1": 2.0}), AR_IDS, ar)
    policy = run_row("policy:p", samples({"c1": 0.5, "c2": 0.5, "t1": 1.25}), AR_IDS, ar)
    rows = [ar, single, policy]
    summary = summarize(rows + [oracle_row(rows)])
    u = summary["uncertainty"]
    assert u["vs_best_single_ci95"][0] <= summary["vs_best_single"] <= u["vs_best_single_ci95"][1]
    assert u["oracle_cv"]["tokens_per_s"] == pytest.approx(single["tokens_per_s"]) and u["vs_oracle_cv"] > 1.0
    table = render_table({"runs": rows, "summary": summary, "params": {"prompts": 3}})
    assert "95% intervals" in table and "cross-validated oracle" in table


def test_a_spec_bench_report_gives_its_columns_and_lists_published_figures_as_published_not_as_runs():
    from deploy.bench.spec_bench import spec_bench_table

    prompts = [BenchPrompt("m", "mt_bench", prompt="a"), BenchPrompt("r", "rag", prompt="b")]
    ids = {"m": [1, 2, 3, 4], "r": [5, 6]}

    def rows(seconds, rounds):
        return [(p, Sample(ids[p.id], seconds[p.id], rounds, {"ngram": {"steps": rounds}}, 0.01, 0.1)) for p in prompts]

    ar = run_row("ar", rows({"m": 1.0, "r": 1.0}, 4), ids, None)
    fast = run_row("single:recycling", rows({"m": 0.5, "r": 1.0}, 2), ids, ar)
    lines = spec_bench_table([ar, fast])
    assert "| run | multi-turn | RAG | mean accepted tokens | overall |" in lines
    assert "| single:recycling | 2.00x | 1.00x | 1.50 | 1.33x |" in lines
    published = [line for line in lines if "Token Recycling" in line]
    assert published and all("published" in line and "not a run" in line for line in published)
    assert "Spec-Bench's columns" in render_table({"params": {}, "runs": [ar, fast]})
    assert "Spec-Bench's columns" not in render_table({"params": {}, "runs": [ar_row()]})


def test_interleaving_takes_the_tasks_in_turn_keeping_each_tasks_order():
    from deploy.bench.prompts import in_turns

    prompts = [BenchPrompt(f"{task}-{i}", task, prompt="x") for task in ("code", "math", "qa") for i in range(3 if task != "qa" else 1)]
    assert [p.id for p in in_turns(prompts)] == ["code-0", "math-0", "qa-0", "code-1", "math-1", "code-2", "math-2"]
