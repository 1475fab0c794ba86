"""Draft-length statistics pooled across target replicas, through the coordinator.

Each replica's engine learns how often each drafter's tokens are reached and accepted by position
(deploy/engine/draft_length.py: counts that only grow). `LengthSharing` pools them: once when the
engine starts and then at most every SHARE_S seconds (`maybe_share`, between batch iterations) it
sends the counts gathered since its last share to the coordinator (`pool_lengths`), which adds
them to the pool's totals (policy/pooled_counts.py) and answers the totals; the engine then holds
those totals plus what it observed while the answer was on its way. So every replica cuts drafts
on every replica's evidence, and a new or restarted replica starts from what the others learned.
The coordinator keeps the totals in its checkpoint, so they survive its restart. With each share
the draft guard's figures per batch size go too (`pool_guard`): the coordinator keeps, per size,
those of the replica with the most iterations there, and a replica seeds the sizes it has not
probed yet from them (deploy/engine/draft_guard.py), so a replacement that starts under load
drafts at once where its peers found drafting pays, instead of probing plain first.

`pool_lengths(delta)` answers the totals, or a `concurrent.futures.Future` of them (the Ray
coordinator's proxy: the scheduler never waits on it, it takes the answer at a later iteration).
A share that fails (the coordinator is restarting) leaves the counts unshared, and the next share
sends them again. One thread calls `maybe_share` (the scheduler's): nothing is locked.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, TimeoutError

import numpy as np

from deploy.engine.draft_guard import DraftGuard
from deploy.engine.draft_length import DraftLengths

SHARE_S = 5.0  # at most this often a replica shares (an iteration is 0.05-1 s)
FIRST_SHARE_TIMEOUT_S = 10.0  # the share at start waits this long for the pool's totals
Key = tuple[str, str, int]
Counts = dict[Key, tuple[np.ndarray, np.ndarray]]
logger = logging.getLogger("specfleet")


def encode(counts: Counts) -> dict[str, list[list[float]]]:
    """Counts keyed by a JSON string of their key, rows as lists (what the coordinator stores)."""
    return {json.dumps(list(key)): [reached.tolist(), accepted.tolist()] for key, (reached, accepted) in counts.items()}


def decode(pooled: Mapping[str, list[list[float]]]) -> Counts:
    counts = {}
    for text, (reached, accepted) in pooled.items():
        drafter, source, cell = json.loads(text)
        counts[(drafter, source, int(cell))] = (np.asarray(reached, dtype=float), np.asarray(accepted, dtype=float))
    return counts


def combine(a: Counts, b: Counts, sign: float = 1.0) -> Counts:
    """a + sign * b, row by row (the shorter row padded with zeros)."""
    out = {key: (reached.copy(), accepted.copy()) for key, (reached, accepted) in a.items()}
    for key, rows in b.items():
        mine = out.get(key, (np.zeros(0), np.zeros(0)))
        out[key] = tuple(_padded_sum(have, more, sign) for have, more in zip(mine, rows))
    return out


def _padded_sum(have: np.ndarray, more: np.ndarray, sign: float) -> np.ndarray:
    total = np.zeros(max(len(have), len(more)))
    total[: len(have)] += have
    total[: len(more)] += sign * more
    return total


class LengthSharing:
    def __init__(self, lengths: DraftLengths, pool_lengths: Callable[[dict], Mapping | Future],
                 every_s: float = SHARE_S, clock: Callable[[], float] = time.monotonic,
                 guard: DraftGuard | None = None, pool_guard: Callable[[dict], Mapping | Future] | None = None) -> None:
        """guard, pool_guard: with each share the draft guard's figures go too, and the buckets it
        has not probed are seeded from the pool's (deploy/engine/draft_guard.py `seed`)."""
        self.lengths, self.pool_lengths, self.every_s, self.clock = lengths, pool_lengths, every_s, clock
        self.guard, self.pool_guard = guard, pool_guard
        self._guard_pending: Future | None = None
        self._taken: Counts = {}  # the pool's totals as last taken
        self._sent: Counts | None = None  # this engine's counts when the share in flight left
        self._pending: Future | None = None
        self._last = -float("inf")
        self.shares = 0  # shares answered and taken

    def maybe_share(self) -> None:
        """Take an answered share; send the next one when SHARE_S has passed since the last."""
        if self._guard_pending is not None and self._guard_pending.done():
            self._seed_guard(self._guard_pending)
        if self._pending is not None:
            if not self._pending.done():
                return
            self._take(self._pending)
        if self.clock() - self._last >= self.every_s:
            self._send()

    def share_now(self, timeout_s: float = FIRST_SHARE_TIMEOUT_S) -> bool:
        """Share and wait for the pool's totals (at start: begin from what the others learned).
        -> whether they were taken."""
        if self._pending is not None:  # the share in flight first: its counts are not to go twice
            if not self._settle(self._pending, timeout_s):
                return False
            self._take(self._pending)
        if not self._send():
            return False
        if self._guard_pending is not None and self._settle(self._guard_pending, timeout_s):
            self._seed_guard(self._guard_pending)
        pending = self._pending
        if pending is None:
            return True  # answered at once
        return self._settle(pending, timeout_s) and self._take(pending)

    @staticmethod
    def _settle(pending: Future, timeout_s: float) -> bool:
        """Wait for an answer (or a failure); False when none came in time."""
        try:
            pending.exception(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def _send(self) -> bool:
        """-> False when the share could not be sent."""
        self._last = self.clock()
        self._sent = self.lengths.counts()
        delta = {key: rows for key, rows in combine(self._sent, self._taken, -1.0).items() if any(r.any() for r in rows)}
        try:
            answer = self.pool_lengths(encode(delta))
        except Exception as err:  # noqa: BLE001 - the coordinator is away: the counts go with the next share
            logger.warning("sharing draft-length statistics failed: %r", err)
            return False
        if isinstance(answer, Future):
            self._pending = answer
        else:
            self._adopt(answer)
        if self.guard is not None and self.pool_guard is not None and self._guard_pending is None:
            try:
                seeds = self.pool_guard(self.guard.state())
            except Exception as err:  # noqa: BLE001 - seeds are a head start only
                logger.warning("sharing the draft guard's figures failed: %r", err)
            else:
                if isinstance(seeds, Future):
                    self._guard_pending = seeds
                else:
                    self.guard.seed(seeds)
        return True

    def _seed_guard(self, pending: Future) -> None:
        self._guard_pending = None
        try:
            self.guard.seed(pending.result())
        except Exception as err:  # noqa: BLE001 - seeds are a head start only
            logger.warning("sharing the draft guard's figures failed: %r", err)

    def _take(self, pending: Future) -> bool:
        """Adopt an answered share's totals. -> False when it failed (its counts go with the next)."""
        self._pending = None
        try:
            totals = pending.result()
        except Exception as err:  # noqa: BLE001 - unshared counts are sent again with the next share
            logger.warning("sharing draft-length statistics failed: %r", err)
            return False
        self._adopt(totals)
        return True

    def _adopt(self, totals: Mapping) -> None:
        """Hold the pool's totals plus what this engine observed since its counts were sent."""
        pooled = decode(totals)
        since_sent = combine(self.lengths.counts(), self._sent or {}, -1.0)
        self.lengths.set_counts(combine(pooled, since_sent))
        self._taken, self._sent = pooled, None
        self.shares += 1
