"""One error type for bad user input: it names the offending field.

Every layer (sampling params, engine, drafter pool, policy registry) raises `InvalidRequestError`
so the CLI and, later, the HTTP layer can turn it into a clear message naming `field`.
"""
from __future__ import annotations


class InvalidRequestError(ValueError):
    """A request or configuration value is invalid; `field` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
