"""What the HTTP and gRPC fronts share between a parsed request and the engine (asyncio; no Ray).

- `sampling_for(target, defaults, prompt_ids, ...)`: a request's sampling fields with the
  service's defaults filled in, validated by `SamplingParams` and `target.check_length`, so
  `InvalidRequestError` names the same field on every front.
- `generate(scheduler, prompt_ids, sampling) -> Finished`: the request joins the replica's running
  batch (deploy/engine/scheduler.py) and is awaited without holding a thread.
- `stream(scheduler, prompt_ids, sampling)`: async iterator of text pieces (at most one per round
  of the request), then one `Finished`. Each round's new tokens are decoded once
  (deploy/service/detokenize.py, which holds back an incomplete UTF-8 character); `StopHoldback`
  holds back text that could still become a stop string and cuts at a stop string. The pieces
  concatenate to exactly the non-streamed text.
- An engine failure other than bad input becomes `TargetUnavailableError` (the cause is chained
  and logged here, not put in the message).
- `TrackedEngine(scheduler, metrics)`: the scheduler as one generation sees it; it counts the
  request waiting (accepted, not submitted yet), then running, on the replica's gauges. A request
  abandoned (`close()`: its coroutine was cancelled because the client left, or it failed) never
  starts, or ends before its next iteration with its cache and drafter sessions freed.
"""
from __future__ import annotations

import asyncio
import logging
import re
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from actors.errors import InvalidRequestError, TargetUnavailableError
from actors.sampling import SamplingParams
from deploy.engine.request import ABORT, GenerationResult
from deploy.engine.scheduler import BatchScheduler
from deploy.engine.target import TargetModel
from deploy.service.detokenize import IncrementalDetokenizer

logger = logging.getLogger("specfleet")


def request_field(field: str, chat: bool) -> str:
    """An engine error's field as the API names it: the prompt is `messages` in a chat request,
    token ids are the `prompt`, and indices are dotted (`messages[0].role` -> `messages.0.role`)."""
    if field == "token_ids":
        field = "prompt"
    if chat and field == "prompt":
        return "messages"
    return re.sub(r"\[(\d+)\]", r".\1", field)


def sampling_for(
    target: TargetModel,
    defaults,  # deploy.config.SamplingDefaults: max_tokens, temperature, top_p
    prompt_ids: Sequence[int],
    *,
    max_tokens: int | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    seed: int | None = None,
    stop: str | Sequence[str] | None = None,
    logprobs: int | None = None,
    cache_salt: str | None = None,
) -> SamplingParams:
    """None means "not given": max_tokens then fills the context up to the service default."""
    if max_tokens is None:
        max_tokens = max(1, min(defaults.max_tokens, target.context_length - len(prompt_ids)))
    sampling = SamplingParams(
        max_tokens=max_tokens,
        temperature=defaults.temperature if temperature is None else temperature,
        top_p=defaults.top_p if top_p is None else top_p,
        top_k=top_k or 0,
        seed=seed,
        stop=tuple([stop] if isinstance(stop, str) else stop or ()),
        logprobs=logprobs,
        cache_salt=cache_salt,
    )
    target.check_length(len(prompt_ids), sampling.max_tokens)
    return sampling


class StopHoldback:
    """How much of a growing text can be sent without ever being taken back: the text that could
    still become a stop string is held, and the text is cut at a stop string."""

    def __init__(self, stop: Sequence[str]) -> None:
        self.stop = tuple(stop)
        self.holdback = max((len(s) for s in self.stop), default=1) - 1
        self.sent = 0  # characters already sent
        self.pending = ""  # characters received and not sent: at most the holdback, between calls
        self.stopped = False

    def advance(self, new_text: str) -> str:
        """`new_text`: what the output's text grew by. -> the new piece that is safe to send ("" if none).
        A stop string can only start in the pending text (the sent text never held one), so the
        search is over the held and new characters only."""
        if self.stopped:
            return ""
        self.pending += new_text
        cuts = [cut for cut in (self.pending.find(s) for s in self.stop) if cut >= 0]
        self.stopped = bool(cuts)
        safe = min(cuts) if cuts else len(self.pending) - self.holdback
        if safe <= 0:
            return ""
        piece, self.pending = self.pending[:safe], self.pending[safe:]
        self.sent += len(piece)
        return piece

    def finish(self, final_text: str) -> str:
        """The rest of the final (non-streamed) text."""
        piece, self.sent = final_text[self.sent:], max(self.sent, len(final_text))
        return piece


class AbandonedError(RuntimeError):
    """The request was closed before its generation started; nobody waits for its result."""


class TrackedEngine:
    """One generation's view of the replica's batch scheduler (`submit`, `target`), keeping the
    request gauges true."""

    def __init__(self, scheduler: BatchScheduler, metrics) -> None:  # metrics: deploy.service.metrics.ServiceMetrics
        self.scheduler, self.target, self.metrics = scheduler, scheduler.target, metrics
        self._lock = threading.Lock()
        self._started = self._closed = False
        metrics.request_waiting()

    def submit(self, prompt_ids: list[int], sampling: SamplingParams, on_tokens=None) -> Future:
        """Join the running batch. -> the future of the GenerationResult."""
        with self._lock:
            if self._closed:
                raise AbandonedError("closed before it started")
            self._started = True
            self.metrics.request_started()
        future = self.scheduler.submit(prompt_ids, sampling, on_tokens, abandoned=lambda: self._closed)
        future.add_done_callback(self._finished)
        return future

    def _finished(self, future: Future) -> None:
        self.metrics.request_finished()
        if not future.cancelled() and future.exception() is None and future.result().finish_reason == ABORT:
            self.metrics.observe_work(future.result())  # nobody is left to observe it

    def close(self) -> None:
        """The request's coroutine is done (answered, failed or cancelled): a generation not yet
        started never will be, and one running ends before its next round (the client left)."""
        with self._lock:
            if not self._started and not self._closed:
                self.metrics.request_finished(started=False)
            self._closed = True


@dataclass(frozen=True)
class Finished:
    result: GenerationResult
    ttft_s: float | None  # streams only: seconds to the first generated token
    e2e_s: float


async def _engine_result(run: Awaitable[GenerationResult]) -> GenerationResult:
    try:
        return await run
    except InvalidRequestError:
        raise
    except Exception as err:
        logger.error("the target failed to generate", exc_info=err)
        raise TargetUnavailableError(f"the target failed to generate ({type(err).__name__}); retry later") from err


async def generate(engine: BatchScheduler | TrackedEngine, prompt_ids: list[int], sampling: SamplingParams) -> Finished:
    start = time.perf_counter()
    result = await _engine_result(asyncio.wrap_future(engine.submit(prompt_ids, sampling)))
    return Finished(result, None, time.perf_counter() - start)


async def stream(engine: BatchScheduler | TrackedEngine, prompt_ids: list[int], sampling: SamplingParams
                 ) -> AsyncIterator[str | Finished]:
    """Text pieces as rounds finish, then one Finished (whose result.text they add up to)."""
    loop = asyncio.get_running_loop()
    updates: asyncio.Queue = asyncio.Queue()  # each round's new tokens, in order
    start = time.perf_counter()
    first_token_s: list[float] = []

    def on_tokens(tokens: list[int]) -> None:  # runs in the scheduler's thread
        if not first_token_s:
            first_token_s.append(time.perf_counter() - start)
        loop.call_soon_threadsafe(updates.put_nowait, list(tokens))

    task = asyncio.wrap_future(engine.submit(prompt_ids, sampling, on_tokens))
    task.add_done_callback(lambda _: loop.call_soon_threadsafe(updates.put_nowait, None))
    holdback, text = StopHoldback(sampling.stop), IncrementalDetokenizer(engine.target)
    while (tokens := await updates.get()) is not None:
        if piece := holdback.advance(text.add(tokens)):
            yield piece
    result = await _engine_result(task)
    if piece := holdback.finish(result.text):
        yield piece
    yield Finished(result, first_token_s[0] if first_token_s else None, time.perf_counter() - start)
