"""Error types every front end maps the same way (HTTP status / gRPC status code).

`InvalidRequestError` (bad user input; names the field): every layer (sampling params, engine,
drafter pool, policy registry) raises it; the CLI prints it, HTTP answers 400 naming `param`,
gRPC INVALID_ARGUMENT with details `<field>: <message>`.
`TargetUnavailableError`: the target could not generate (its model or its drafting pool failed,
e.g. the coordinator actor died); HTTP answers 503, gRPC UNAVAILABLE. Retrying later may succeed.
"""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request or configuration value is invalid; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def __reduce__(self):  # pickles (e.g. across Ray processes) with both arguments
        return type(self), (self.field, self.message)


class TargetUnavailableError(RuntimeError):
    """The target failed while generating; the cause is chained (`__cause__`), not in the message."""
