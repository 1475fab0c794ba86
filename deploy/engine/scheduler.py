"""Continuous batching: one thread owns the target and runs iterations over every request in flight.

`BatchScheduler(engine).run(prompt_ids, sampling, on_tokens, abandoned)` has `SpeculativeEngine.run`'s
contract and may be called from any number of threads at once. Each iteration:

    admit    waiting requests join (up to `max_batch` in flight): checked and opened; their
             prompts are prefilled in the iteration's forward, at most `prefill_tokens` per
             iteration (a long prompt in chunks over several iterations)
    drop     a request whose caller left (`abandoned()` true) ends, finish_reason "abort", its
             cache and drafter sessions freed before the next forward
    round    one speculative round of every prefilled request, verified in one batched target
             forward with the prompt chunks (`SpeculativeEngine.iterate`); each request's new tokens go to its
             `on_tokens` as the iteration ends; finished requests leave and answer their caller

Requests join and leave between iterations only; between them, too, the engine pools its
draft-length statistics with the other replicas' (deploy/engine/shared_lengths.py: once when it
starts, then at most every few seconds). A failure of the iteration's forward or drafting
fails the requests in it (each caller gets the exception) and the scheduler goes on serving.

Every forward runs in the scheduler's one thread, and a server builds its engine there too
(`BatchScheduler(build)`): torch's OpenMP runtime (libgomp) throttles its threads' spinning as soon
as a process has more of them than cores, which a second thread running torch causes (measured on
this 2-core machine: 16 tok/s instead of 27 for plain decoding in a thread, when the main thread
had run torch first).
`rows` and `iterations` count the forwards' rows, so a test can see a cancelled request stop
costing forwards.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from actors.sampling import SamplingParams
from deploy.engine.defaults import MAX_BATCH, PREFILL_TOKENS
from deploy.engine.engine import SpeculativeEngine
from deploy.engine.request import ABORT, GenerationResult, RequestState

logger = logging.getLogger("specfleet")


@dataclass
class _Job:
    prompt_ids: list[int]
    sampling: SamplingParams
    on_tokens: Callable[[list[int]], None] | None
    abandoned: Callable[[], bool] | None
    future: Future = field(default_factory=Future)
    request: RequestState | None = None
    prefilled: int = 0  # prompt tokens in the cache (all but the last are prefilled)

    @property
    def ready(self) -> bool:
        return self.prefilled >= len(self.prompt_ids) - 1


class BatchScheduler:
    def __init__(self, engine: SpeculativeEngine | Callable[[], SpeculativeEngine], max_batch: int = MAX_BATCH,
                 prefill_tokens: int = PREFILL_TOKENS, between_iterations: Callable[[], object] | None = None) -> None:
        """engine: the engine, or a function that builds it, called in the scheduler's thread (so
        that loading the target is that thread's torch work too: see the module's docstring).
        between_iterations: called in that thread after each iteration (a server re-sizes torch's
        threads there)."""
        self.max_batch, self.prefill_tokens = max_batch, prefill_tokens
        self.between_iterations = between_iterations
        self._waiting: deque[_Job] = deque()
        self._wake = threading.Condition()
        built: Future = Future()
        threading.Thread(target=self._main, args=(engine, built), name="specfleet-scheduler", daemon=True).start()
        self.engine: SpeculativeEngine = built.result()  # a build failure raises here
        self.target = self.engine.target
        self.iterations = 0  # speculative rounds run (batched forwards)
        self.rows = 0  # requests verified, summed over those forwards

    def run(self, prompt_ids: list[int], sampling: SamplingParams, on_tokens=None,
            abandoned: Callable[[], bool] | None = None) -> GenerationResult:
        """Generate as part of the running batch; blocks until this request ends."""
        return self.submit(prompt_ids, sampling, on_tokens, abandoned).result()

    def submit(self, prompt_ids: list[int], sampling: SamplingParams, on_tokens=None,
               abandoned: Callable[[], bool] | None = None) -> Future:
        job = _Job(list(prompt_ids), sampling, on_tokens, abandoned)
        with self._wake:
            self._waiting.append(job)
            self._wake.notify()
        return job.future

    def _main(self, engine: SpeculativeEngine | Callable[[], SpeculativeEngine], built: Future) -> None:
        try:
            engine = engine() if callable(engine) else engine
            engine.enable_batching()  # measures the batch forward's costs (a few seconds)
            engine.share_learning(wait=True)  # start from what the other replicas learned
        except BaseException as err:  # noqa: BLE001 - the constructor raises it
            built.set_exception(err)
            return
        built.set_result(engine)
        self._loop()

    def _loop(self) -> None:
        jobs: list[_Job] = []
        while True:
            with self._wake:
                while not self._waiting and not jobs:
                    self._wake.wait()
                while self._waiting and len(jobs) < self.max_batch:
                    jobs.append(self._waiting.popleft())
            try:
                jobs = self._iteration(jobs)
                self.engine.share_learning()
                if self.between_iterations is not None:
                    self.between_iterations()
            except Exception as err:  # noqa: BLE001 - every caller in the batch gets it; serving goes on
                logger.error("a batch iteration failed", exc_info=err)
                for job in jobs:
                    self._end(job, err)
                jobs = []

    def _iteration(self, jobs: list[_Job]) -> list[_Job]:
        """One iteration; -> the jobs still in flight."""
        alive = []
        for job in jobs:
            if job.request is None:
                if not job.future.set_running_or_notify_cancel():
                    continue  # cancelled while it waited
                try:
                    job.request = self.engine.open(job.prompt_ids, job.sampling, prefill=False)
                except Exception as err:  # noqa: BLE001 - bad input answers its own caller
                    job.future.set_exception(err)
                    continue
            if job.abandoned is not None and job.abandoned():
                job.request.finish = ABORT
                self._end(job)
                continue
            alive.append(job)
        batch = [job for job in alive if job.ready]
        prefill = self._prefill_chunks([job for job in alive if not job.ready])
        if batch or prefill:
            traces = self.engine.iterate([job.request for job in batch], [(job.request, chunk) for job, chunk in prefill])
            for job, chunk in prefill:
                job.prefilled += len(chunk)
            if batch:
                self.iterations += 1
                self.rows += len(batch)
            for job, trace in zip(batch, traces):
                if job.on_tokens is not None and trace.emitted:
                    job.on_tokens(job.request.output[-trace.emitted:])
                if job.request.finish is not None:
                    self._end(job)
        return [job for job in alive if job.request.finish is None]

    def _prefill_chunks(self, jobs: list[_Job]) -> list[tuple[_Job, list[int]]]:
        """The prompt chunks this iteration's forward prefills: at most `prefill_tokens` of them."""
        chunks, budget = [], self.prefill_tokens
        for job in jobs:
            if budget <= 0:
                break
            chunk = job.prompt_ids[job.prefilled : min(len(job.prompt_ids) - 1, job.prefilled + budget)]
            chunks.append((job, chunk))
            budget -= len(chunk)
        return chunks

    def _end(self, job: _Job, error: Exception | None = None) -> None:
        """Free the request and answer its caller."""
        if job.request is not None:
            try:
                self.engine.close(job.request)
            except Exception as err:  # noqa: BLE001 - the answer still goes out
                logger.warning("closing a request failed", exc_info=err)
                error = error or err
        if job.future.done():
            return
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(self.engine.result(job.request))
