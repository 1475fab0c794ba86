"""The gRPC protocol layer: specfleet.v1 messages <-> engine inputs and results (no Ray).

The service is deploy/service/proto/specfleet.proto; its Python stubs are generated at install
(`make install`), so only the gRPC front imports this module. Contract:

- `parse_request(request, target, defaults, model_name) -> (prompt_ids, SamplingParams)` applies
  the HTTP API's rules (deploy/service/generation.sampling_for): unset optional fields take the service's
  defaults; bad input raises InvalidRequestError naming the field as HTTP names it (`prompt`,
  `messages`, `messages.0.role`, `max_tokens`, `temperature`, `top_p`, `top_k`, `seed`, `stop`,
  `model`).
- `response(request_id, model, result)`: the unary GenerateResponse (text, token_ids,
  finish_reason, usage, metrics, timing; the last two only with `with_metrics`); with `text=""` it
  is a stream's last message.
  `piece(request_id, model, text)`: an intermediate stream message.
- `status_for(err) -> (grpc.StatusCode, details)`: InvalidRequestError -> INVALID_ARGUMENT
  (`<field>: <message>`), AuthenticationError -> UNAUTHENTICATED, TargetUnavailableError ->
  UNAVAILABLE. `set_status(context, err)` writes them on a (Ray Serve) gRPC context.
"""
from __future__ import annotations

import grpc

from actors.errors import InvalidRequestError, TargetUnavailableError
from actors.sampling import SamplingParams
from deploy.engine.request import GenerationResult
from deploy.engine.target import TargetModel
from deploy.service.auth import AuthenticationError
from deploy.service.generation import request_field, sampling_for
from deploy.service.openai_api import spec_metrics, usage
from deploy.service.proto import specfleet_pb2 as pb

STATUS_ERRORS = (InvalidRequestError, AuthenticationError, TargetUnavailableError)
_OPTIONAL = ("max_tokens", "temperature", "top_p", "top_k", "seed")


def parse_request(request: pb.GenerateRequest, target: TargetModel, defaults, model_name: str,
                  cache_salt: str | None = None) -> tuple[list[int], SamplingParams]:
    if request.model and request.model != model_name:
        raise InvalidRequestError("model", f"model {request.model!r} does not exist; this server serves {model_name!r}")
    chat = len(request.messages) > 0
    if chat == bool(request.prompt):
        raise InvalidRequestError("prompt", "give exactly one of prompt or messages")
    given = {name: getattr(request, name) for name in _OPTIONAL if request.HasField(name)}
    try:
        if chat:
            prompt_ids = target.encode(messages=[{"role": m.role, "content": m.content} for m in request.messages])
        else:
            prompt_ids = target.encode(prompt=request.prompt)
        sampling = sampling_for(target, defaults, prompt_ids, stop=tuple(request.stop), cache_salt=cache_salt, **given)
    except InvalidRequestError as err:
        raise InvalidRequestError(request_field(err.field, chat), err.message) from None
    return prompt_ids, sampling


def _metrics(result: GenerationResult) -> tuple[pb.SpeculativeMetrics, pb.Timing]:
    measured = spec_metrics(result)
    sd = measured["speculative_decoding"]
    metrics = pb.SpeculativeMetrics(
        mean_acceptance_length=sd["mean_acceptance_length"],
        acceptance_histogram={int(accepted): steps for accepted, steps in sd["acceptance_histogram"].items()},
        num_spec_steps=sd["num_spec_steps"],
        num_draft_tokens=sd["num_draft_tokens"],
        num_accepted_draft_tokens=sd["num_accepted_draft_tokens"],
        per_drafter={name: pb.DrafterCounts(**counts) for name, counts in sd["per_drafter"].items()},
    )
    if sd["draft_acceptance_rate"] is not None:
        metrics.draft_acceptance_rate = sd["draft_acceptance_rate"]
    return metrics, pb.Timing(**measured["timing"])


def response(request_id: str, model: str, result: GenerationResult, text: str | None = None,
             with_metrics: bool = True) -> pb.GenerateResponse:
    """with_metrics=False (the config's `request_metrics` off) leaves metrics and timing unset."""
    reply = pb.GenerateResponse(
        id=request_id, model=model, text=result.text if text is None else text, token_ids=result.token_ids,
        finish_reason=result.finish_reason, usage=pb.Usage(**usage(result)),
    )
    if with_metrics:
        metrics, timing = _metrics(result)
        reply.metrics.CopyFrom(metrics)
        reply.timing.CopyFrom(timing)
    return reply


def piece(request_id: str, model: str, text: str) -> pb.GenerateResponse:
    return pb.GenerateResponse(id=request_id, model=model, text=text)


def status_for(err: Exception) -> tuple[grpc.StatusCode, str]:
    if isinstance(err, InvalidRequestError):
        return grpc.StatusCode.INVALID_ARGUMENT, str(err)
    if isinstance(err, AuthenticationError):
        return grpc.StatusCode.UNAUTHENTICATED, str(err)
    if isinstance(err, TargetUnavailableError):
        return grpc.StatusCode.UNAVAILABLE, str(err)
    raise TypeError(f"no gRPC status for {type(err).__name__}")


def set_status(context, err: Exception) -> None:
    code, details = status_for(err)
    context.set_code(code)
    context.set_details(details)
