"""A bench under load (deploy/bench/load_report.py, deploy/bench/runs.py): repeated sweeps run in
alternating order and make one row of their medians with each repetition kept; each run that
drafts is compared with drafting off and with peer:hf-batch at its level, per repetition too;
the engine's calibration and guard per batch size are summed over repetitions, tabled and charted."""
import pytest

from actors.errors import InvalidRequestError
from deploy.bench.charts import reliability_chart
from deploy.bench.load_report import merge_loads, render_load, sweep_ratios, swept_row
from deploy.bench.runs import run_bench, sweep_order
from tests.bench.test_bench_report import AR_IDS, ar_row, samples

FAST, SLOW = {"c1": 1.0, "c2": 1.0, "t1": 1.0}, {"c1": 2.0, "c2": 2.0, "t1": 2.0}


def load(nodes: int, accepted: float, drafting: bool) -> dict:
    return {"calibration": {"25-32": {"nodes": nodes, "expected": 0.9, "accepted": accepted,
                                      "bins": [[0.9, nodes, 0.9, accepted, 0.6]]}},
            "guard": {"25-32": {"drafted_iterations": 10, "drafted_gain": 0.9, "plain_iterations": 30,
                                "plain_gain": 1.0, "drafting": drafting}}}


def test_repetitions_run_in_alternating_order_and_in_process_runs_skip_level_one():
    order = sweep_order([1, 8], ["batch:a", "batch:b", "peer:hf-batch"], ["peer:hf-batch"], repeat=2, alternate=True)
    assert order == [(1, "batch:a"), (1, "batch:b"), (1, "batch:b"), (1, "batch:a"),
                     (8, "batch:a"), (8, "batch:b"), (8, "peer:hf-batch"),
                     (8, "peer:hf-batch"), (8, "batch:b"), (8, "batch:a")]
    assert sweep_order([8], ["batch:a", "batch:b"], [], repeat=2) == [(8, "batch:a"), (8, "batch:b")] * 2


def test_a_repeated_sweep_reports_the_median_and_keeps_each_repetition():
    ar = ar_row()
    reps = [(samples(FAST), wall, {}) for wall in (1.0, 2.0, 4.0)]  # 10 tokens: 10, 5 and 2.5 tok/s
    row = swept_row("batch:x@c8", reps, AR_IDS, ar, 8)
    assert row["tokens_per_s"] == 5.0 and row["repeats"]["tokens_per_s"] == [10.0, 5.0, 2.5]
    assert row["concurrency"] == 8 and row["lossless"] is True and "load" not in row
    assert swept_row("batch:x@c8", reps[:1], AR_IDS, ar, 8)["tokens_per_s"] == 10.0  # one repetition: its own row


def test_load_reports_of_repetitions_are_summed():
    merged = merge_loads([load(100, 0.5, False), load(300, 0.7, True)])
    calibration, guard = merged["calibration"]["25-32"], merged["guard"]["25-32"]
    assert calibration["nodes"] == 400 and calibration["accepted"] == 0.65 and calibration["bins"][0][1] == 400
    assert guard["plain_iterations"] == 60 and guard["drafting"] == [False, True]


def test_each_drafting_run_is_compared_with_drafting_off_and_the_padded_peer_at_its_level(tmp_path):
    ar = ar_row()
    rows = [ar, swept_row("batch:x@c8", [(samples(FAST), 1.0, load(100, 0.5, True)), (samples(FAST), 2.0, {})], AR_IDS, ar, 8),
            swept_row("batch:fixed:none@c8", [(samples(SLOW), 2.0, {}), (samples(SLOW), 2.0, {})], AR_IDS, ar, 8),
            swept_row("peer:hf-batch@c8", [(samples(FAST), 4.0, {}), (samples(FAST), 4.0, {})], AR_IDS, ar, 8)]
    (entry,) = sweep_ratios(rows)
    assert entry["run"] == "batch:x@c8" and entry["tokens_per_s"] == 7.5 and entry["spread"] == [5.0, 10.0]
    assert entry["vs_off"] == 1.5 and entry["vs_off_each"] == [2.0, 1.0]
    assert entry["vs_hf_batch"] == 3.0 and entry["vs_hf_batch_each"] == [4.0, 2.0]
    report = {"model": "m", "runs": rows, "params": {"prompts": 3, "max_tokens": 4, "repeat": 2, "alternate": True},
              "summary": {"under_load": [entry]}}
    table = "\n".join(render_load(report))
    assert "| 8 | batch:x@c8 | 7.5 | 5.0-10.0 | 1.500x (2.00, 1.00) | 3.000x (4.00, 2.00) |" in table
    assert "| 25-32 | 100 | 0.900 | 0.500 | 10 (0.900) | 30 (1.000) | yes |" in table
    assert reliability_chart(report, tmp_path / "r.png").stat().st_size > 0


@pytest.mark.parametrize("repeat", [0, 10, True])
def test_a_repeat_out_of_range_is_refused_naming_repeat(repeat):
    with pytest.raises(InvalidRequestError) as err:
        run_bench(None, [], repeat=repeat)
    assert err.value.field == "repeat"
