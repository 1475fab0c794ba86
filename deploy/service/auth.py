"""Optional API keys: one check shared by the HTTP front (/v1/*) and the gRPC front (pure; no Ray).

Where keys come from (all sources together; none configured = the API is open):
  - `SPECFLEET_API_KEYS`: comma-separated keys;
  - a key file, one key per line (blank lines and `#` comments ignored), whose path is
    `SPECFLEET_API_KEY_FILE` or the service config's `api_key_file`.
A key never sits in the config itself (deploy/config.py refuses `api_keys` there).

The admin API (/admin/*) always needs an admin token, from `SPECFLEET_ADMIN_TOKEN`, the file
named by `SPECFLEET_ADMIN_TOKEN_FILE`, or else `~/.specfleet/admin_token` when it exists
(`ApiKeys.admin`); with none, the admin API is off (403). The same file serves the CLI.

`ApiKeys.resolve(environ, key_file)` runs once, in `deploy.service.app.build_app`; the object keeps only
SHA-256 digests of the keys, so what travels to the Serve replica (a deployment init arg) and
whatever Serve stores about it cannot be replayed as a key. `check(authorization)` takes the
HTTP `Authorization` header or the gRPC `authorization` metadata (`Bearer <key>`) and raises
`AuthenticationError` naming the problem (missing, not a bearer token, unknown key); the
message never contains the presented or the configured keys. Digests are compared with
`hmac.compare_digest`, against every configured key (no early exit).

`refusal(path, authorization, api_keys, admin_keys)` is the ingress's gate (deploy/service/front.py):
for /v1/* the API keys, for /admin/* the admin token (403 when there is none), else nothing;
-> None or (HTTP status, message, OpenAI error type), decided before any body is read.
"""
from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from actors.errors import InvalidRequestError

KEYS_ENV = "SPECFLEET_API_KEYS"
KEY_FILE_ENV = "SPECFLEET_API_KEY_FILE"
ADMIN_TOKEN_ENV = "SPECFLEET_ADMIN_TOKEN"
ADMIN_TOKEN_FILE_ENV = "SPECFLEET_ADMIN_TOKEN_FILE"
DEFAULT_ADMIN_TOKEN_FILE = "~/.specfleet/admin_token"


class AuthenticationError(Exception):
    """The request lacks a valid API key; the message says what is wrong (never the key)."""


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _valid(key: str, where: str, index: int) -> str:
    if not key.isascii() or not key.isprintable() or any(c.isspace() for c in key):
        raise InvalidRequestError("api_keys", f"key {index} in {where} must be printable ASCII without spaces")
    return key


def _read_key_file(path: str, field: str) -> list[str]:
    try:
        lines = Path(path).expanduser().read_text().splitlines()
    except OSError as err:
        raise InvalidRequestError(field, f"cannot read the key file {path!r}: {err.strerror}") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise InvalidRequestError(field, f"the key file {path!r} holds no keys")
    return [_valid(k, f"key file {path!r}", i + 1) for i, k in enumerate(keys)]


def env_keys(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The keys listed in `SPECFLEET_API_KEYS` (comma-separated; none when unset)."""
    listed = environ.get(KEYS_ENV, "").strip()
    if not listed:
        return []
    parts = [k.strip() for k in listed.split(",")]
    if not all(parts):
        raise InvalidRequestError("api_keys", f"{KEYS_ENV} holds an empty key (check its commas)")
    return [_valid(k, KEYS_ENV, i + 1) for i, k in enumerate(parts)]


def admin_tokens(environ: Mapping[str, str] = os.environ) -> list[str]:
    """`SPECFLEET_ADMIN_TOKEN`, else the file `SPECFLEET_ADMIN_TOKEN_FILE`, else ~/.specfleet/admin_token if present."""
    token = environ.get(ADMIN_TOKEN_ENV, "").strip()
    if token:
        return [_valid(token, ADMIN_TOKEN_ENV, 1)]
    path = environ.get(ADMIN_TOKEN_FILE_ENV, "").strip()
    if path:
        return _read_key_file(path, ADMIN_TOKEN_FILE_ENV)
    default = Path(DEFAULT_ADMIN_TOKEN_FILE).expanduser()
    return _read_key_file(str(default), "admin_token") if default.is_file() else []


@dataclass(frozen=True, repr=False)
class ApiKeys:
    digests: tuple[bytes, ...] = ()

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> "ApiKeys":
        return cls(tuple(_digest(k) for k in keys))

    @classmethod
    def resolve(cls, environ: Mapping[str, str] = os.environ, key_file: str | None = None) -> "ApiKeys":
        """Keys from `SPECFLEET_API_KEYS`, the file named by `SPECFLEET_API_KEY_FILE` and `key_file`
        (the config's `api_key_file`). Unreadable or empty sources raise InvalidRequestError."""
        keys = env_keys(environ)
        if environ.get(KEY_FILE_ENV, "").strip():
            keys += _read_key_file(environ[KEY_FILE_ENV].strip(), KEY_FILE_ENV)
        if key_file:
            keys += _read_key_file(key_file, "api_key_file")
        return cls.from_keys(dict.fromkeys(keys))

    @classmethod
    def admin(cls, environ: Mapping[str, str] = os.environ) -> "ApiKeys":
        """The admin tokens (see the module doc); empty when none is configured."""
        return cls.from_keys(admin_tokens(environ))

    @property
    def required(self) -> bool:
        return bool(self.digests)

    def check(self, authorization: str | None) -> None:
        """Pass, or raise AuthenticationError. `authorization`: the header/metadata value or None."""
        if not self.digests:
            return
        if not authorization or not authorization.strip():
            raise AuthenticationError("missing API key: send the header `Authorization: Bearer <key>`")
        scheme, _, key = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise AuthenticationError("the Authorization header must be `Bearer <key>`")
        presented = _digest(key.strip())
        matched = False
        for digest in self.digests:  # compare with every key: no early exit
            matched |= hmac.compare_digest(presented, digest)
        if not matched:
            raise AuthenticationError("invalid API key")

    def tenant(self, authorization: str | None) -> str:
        """Who the (already checked) key belongs to, as a name that reveals nothing about it: a
        prefix of the digest of its digest; "" when keys are off. Partitions per-tenant caches."""
        if not self.digests or not authorization:
            return ""
        key = authorization.strip().partition(" ")[2].strip()
        return hashlib.sha256(_digest(key)).hexdigest()[:16]

    def __repr__(self) -> str:  # never the digests, let alone keys
        return f"ApiKeys({len(self.digests)} key{'s' if len(self.digests) != 1 else ''})"


def service_keys(key_file: str | None) -> tuple[ApiKeys, ApiKeys]:
    """(the API keys, the admin tokens) as this process's environment and files configure them."""
    return ApiKeys.resolve(os.environ, key_file), ApiKeys.admin(os.environ)


def ensure_admin_token(environ: Mapping[str, str] = os.environ) -> Path | None:
    """`specfleet serve`'s first start: with no admin token configured, write a new one to
    ~/.specfleet/admin_token (0600, in a 0700 directory) for the CLI and the service to share.
    -> its path, or None when a token was already configured."""
    if admin_tokens(environ):
        return None
    import secrets

    path = Path(DEFAULT_ADMIN_TOKEN_FILE).expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never over an existing file
    with os.fdopen(descriptor, "w") as out:
        out.write(secrets.token_hex(32) + "\n")
    return path


ADMIN_OFF = ("the admin API is off: start the service with an admin token "
             "(SPECFLEET_ADMIN_TOKEN, SPECFLEET_ADMIN_TOKEN_FILE or ~/.specfleet/admin_token)")


def refusal(path: str, authorization: str | None, api_keys: ApiKeys, admin_keys: ApiKeys
            ) -> tuple[int, str, str] | None:
    """Why a request to `path` may not pass the ingress (status, message, error type), or None."""
    if path.startswith("/admin"):
        if not admin_keys.required:
            return 403, ADMIN_OFF, "permission_error"
        keys = admin_keys
    elif path.startswith("/v1"):
        keys = api_keys
    else:
        return None
    try:
        keys.check(authorization)
    except AuthenticationError as err:
        return 401, str(err), "authentication_error"
    return None
