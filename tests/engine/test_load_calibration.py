"""Acceptance calibrated under load (deploy/engine/load_calibration.py): batches are grouped by
size; a size whose verified nodes were accepted less often than the planner expected gets its
estimates lowered, other sizes keep theirs; the correction follows recent iterations; and the
reliability report counts every node verified."""
import pytest

from deploy.engine.load_calibration import LoadCalibration, batch_bucket, bucket_label


@pytest.mark.parametrize(("rows", "bucket", "label"), [(1, 1, "1"), (2, 2, "2"), (3, 4, "3-4"), (8, 8, "7-8"),
                                                      (28, 32, "25-32"), (64, 64, "49-64"), (100, 64, "49-64")])
def test_batches_are_grouped_by_size(rows, bucket, label):
    assert batch_bucket(rows) == bucket and bucket_label(bucket) == label


def test_without_evidence_the_estimates_are_left_as_they_are():
    assert LoadCalibration().correct(28, [0.95, 0.5]) == [0.95, 0.5]


def overestimated_at(calibration: LoadCalibration, rows: int, iterations: int = 30) -> None:
    """Batches of `rows` that expected 0.9 of each of 20 nodes and accepted half of them."""
    for _ in range(iterations):
        calibration.observe(rows, [0.9] * 20, [True, False] * 10)


def test_a_batch_size_that_accepted_less_than_expected_has_its_estimates_lowered_and_no_other():
    calibration = LoadCalibration()
    overestimated_at(calibration, 28)
    lowered = calibration.correct(30, [0.9])[0]  # 30 rows: the same bucket as 28
    assert 0.45 <= lowered < 0.55
    assert calibration.correct(8, [0.9]) == [0.9]


def test_an_underestimating_size_is_raised_but_never_above_one():
    calibration = LoadCalibration()
    for _ in range(30):
        calibration.observe(8, [0.5] * 20, [True] * 20)
    assert calibration.correct(8, [0.5])[0] > 0.8 and calibration.correct(8, [0.55]) == [1.0]


def test_the_correction_follows_the_recent_iterations():
    calibration = LoadCalibration()
    overestimated_at(calibration, 28)
    for _ in range(200):  # acceptance recovers: what was expected is accepted
        calibration.observe(28, [0.9] * 20, [True] * 18 + [False] * 2)
    assert calibration.correct(28, [0.9])[0] == pytest.approx(0.9, abs=0.03)


def test_the_report_counts_every_node_verified_per_size():
    calibration = LoadCalibration()
    overestimated_at(calibration, 28, iterations=3)
    calibration.observe(8, [0.3, 0.95], [False, True])
    report = calibration.report()
    assert report["25-32"]["nodes"] == 60 and report["25-32"]["expected"] == 0.9 and report["25-32"]["accepted"] == 0.5
    assert [b[:4] for b in report["7-8"]["bins"]] == [[0.3, 1, 0.3, 0.0], [0.9, 1, 0.95, 1.0]]
