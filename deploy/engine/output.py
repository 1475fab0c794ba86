"""The output layer: a round's verified tokens become the request's output, and the output
becomes the caller's text. EOS, max_tokens and stop strings end a request here and nowhere else."""
from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

from deploy.engine.logprobs import TokenLogprob
from deploy.engine.request import GenerationResult, RequestState

STOP_LOOKBACK = 16  # tokens before the round's own decoded with them to find a stop string across the boundary


def commit(request: RequestState, emitted_ids: Sequence[int], eos_ids: Collection[int], decode: Callable[[list[int]], str],
           logprobs: Sequence[TokenLogprob] = ()) -> int:
    """Append the round's tokens (and their log-probabilities, when asked) to the output,
    honouring EOS, max_tokens and stop strings (`request.finish` set). -> how many were emitted."""
    output, sampling = request.output, request.sampling
    before = len(output)
    request.tokens.extend(emitted_ids)
    for i, token in enumerate(emitted_ids):
        if token in eos_ids:
            request.finish = "stop"
            return len(output) - before
        output.append(token)
        if logprobs:
            request.logprobs.append(logprobs[i])
        if len(output) >= sampling.max_tokens:
            request.finish = "length"
            return len(output) - before
    if sampling.stop:
        tail = decode(output[-(len(emitted_ids) + STOP_LOOKBACK) :])
        if any(stop in tail for stop in sampling.stop):
            request.finish = "stop"
    return len(output) - before


def result(request: RequestState, decode: Callable[[list[int]], str]) -> GenerationResult:
    """The request's text and tokens, cut at the first stop string."""
    output, finish, stops = request.output, request.finish, request.sampling.stop
    text = decode(output)
    cuts = [cut for cut in (text.find(stop) for stop in stops) if cut >= 0]
    if cuts:
        text, finish = text[: min(cuts)], "stop"
        while output and any(stop in decode(output[:-1]) for stop in stops):
            output.pop()  # token ids end with the token that completed the stop string
    logprobs = request.logprobs[: len(output)] if request.sampling.logprobs is not None else None
    return GenerationResult(text, output, finish, len(request.prompt_ids), request.rounds, logprobs)
