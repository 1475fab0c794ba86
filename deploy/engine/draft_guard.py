"""A guard per batch size: drafting goes on in a batch bucket only while it is realised to pay there.

The planner prices drafts with a cost model and acceptance estimates; both can be wrong under
load (a compute-bound forward, optimistic acceptance), and then speculation costs throughput.
`DraftGuard` judges by the result instead. Per batch-size bucket (deploy/engine/load_calibration.py)
it keeps the realised gain of iterations that drafted and of iterations that did not:

    gain = emitted tokens / iteration seconds  /  (rows / profiled plain forward seconds)

(the iteration's throughput against what a plain forward of its rows and prompt chunks costs on
the target's measured profile, so iterations of different sizes within a bucket compare). Its
means are running means turning into moving averages (ALPHA). The decision per iteration
(`drafts`):

    no plain figure yet        a plain probe (PROBES of them), then PROBES drafting ones
    drafting pays (d >= p)     draft; one iteration in REPROBE_EVERY plain, to keep p current
    drafting does not pay      plain; one iteration in RETRY_EVERY drafts, to see it pay again

A bucket's figures are its own, so when load falls the smaller batches draft by theirs. Plain
iterations are plain target steps: output is unchanged whatever the guard decides. A new replica
seeds the buckets it has not probed from the pool's figures (`seed`, through the coordinator:
deploy/engine/shared_lengths.py).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from deploy.engine.load_calibration import batch_bucket, bucket_label

PROBES = 3
REPROBE_EVERY = 25
RETRY_EVERY = 10
ALPHA = 0.1


@dataclass
class _Arm:
    iterations: int = 0
    gain: float = 0.0

    def observe(self, gain: float) -> None:
        self.iterations += 1
        self.gain += (gain - self.gain) * max(ALPHA, 1.0 / self.iterations)


@dataclass
class _Bucket:
    drafted: _Arm
    plain: _Arm
    decided: int = 0  # decisions taken after the probes


class DraftGuard:
    def __init__(self) -> None:
        self._buckets: dict[int, _Bucket] = {}

    def _bucket(self, rows: int) -> _Bucket:
        return self._buckets.setdefault(batch_bucket(rows), _Bucket(_Arm(), _Arm()))

    def pays(self, rows: int) -> bool | None:
        """Whether drafting realised at least a plain iteration's gain in this bucket (None: not
        measured yet)."""
        bucket = self._buckets.get(batch_bucket(rows))  # asking creates no bucket
        if bucket is None or bucket.plain.iterations < PROBES or bucket.drafted.iterations < PROBES:
            return None
        return bucket.drafted.gain >= bucket.plain.gain

    def drafts(self, rows: int) -> bool:
        """Whether an iteration of `rows` requests may draft."""
        bucket = self._bucket(rows)
        if bucket.plain.iterations < PROBES:
            return False
        if bucket.drafted.iterations < PROBES:
            return True
        bucket.decided += 1
        if self.pays(rows):
            return bucket.decided % REPROBE_EVERY != 0
        return bucket.decided % RETRY_EVERY == 0

    def observe(self, rows: int, drafted: bool, gain: float) -> None:
        """An iteration's realised gain; `drafted`: whether the guard let it draft."""
        bucket = self._bucket(rows)
        (bucket.drafted if drafted else bucket.plain).observe(gain)

    def state(self) -> dict[str, list[float]]:
        """Per bucket (its key, as text): [drafted iterations, drafted gain, plain iterations,
        plain gain]: what another replica may start from (`seed`)."""
        return {str(key): [b.drafted.iterations, b.drafted.gain, b.plain.iterations, b.plain.gain]
                for key, b in self._buckets.items()}

    def seed(self, pooled: Mapping[str, Sequence[float]]) -> None:
        """Start each arm this guard has not probed yet (fewer than PROBES iterations) from
        another replica's figures (`state`), counted as PROBES iterations: it decides at once
        instead of probing, and its own iterations soon outweigh the seed. A replica that starts
        under load so skips the plain probes its peers already ran."""
        for key, (drafted_n, drafted_gain, plain_n, plain_gain) in pooled.items():
            bucket = self._buckets.setdefault(int(key), _Bucket(_Arm(), _Arm()))
            for arm, iterations, gain in ((bucket.drafted, drafted_n, drafted_gain), (bucket.plain, plain_n, plain_gain)):
                if arm.iterations < PROBES <= iterations:
                    arm.iterations, arm.gain = PROBES, float(gain)

    def report(self) -> dict[str, dict]:
        """Per bucket (label): iterations and mean gain with and without drafting, and whether
        drafting paid at the end."""
        return {bucket_label(key): {"drafted_iterations": b.drafted.iterations, "drafted_gain": round(b.drafted.gain, 4),
                                    "plain_iterations": b.plain.iterations, "plain_gain": round(b.plain.gain, 4),
                                    "drafting": self.pays(key)}
                for key, b in sorted(self._buckets.items())}
