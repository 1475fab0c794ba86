"""The service configuration: the `args` of `deploy/serve_config.yaml`, validated by pydantic.

Errors name the field (pydantic's location, e.g. `drafters.1.kind`). Drafter kinds and policy
names are checked against the same tables the engine uses. API keys never sit here: the config
may only name a key file (`api_key_file`, see deploy/service/auth.py); `api_keys` is refused without
echoing its value.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from actors.models import DEFAULT_MODEL, DTYPES
from actors.pool import DRAFTER_KINDS, default_drafters, is_drafter_kind
from deploy.engine.defaults import MAX_BATCH, MAX_K, MAX_PADDING, K
from policy.coordinator import DRAFT_TIMEOUT_S, REQUEST_TTL_S
from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY, ENSEMBLE, parse_policy


def _one_of(value: str, allowed: list[str]) -> str:
    if value not in allowed:
        raise ValueError(f"must be one of {allowed}")
    return value


class AutoscalingConfig(BaseModel):
    """Serve's autoscaling of the target replicas (each replica takes the resources of one: its GPU
    on a GPU cluster, the target's memory on CPU)."""
    model_config = ConfigDict(extra="forbid")
    min_replicas: int = Field(default=1, ge=1)
    max_replicas: int = Field(default=2, ge=1)
    target_ongoing_requests: float = Field(default=16, gt=0)  # requests per replica Serve steers toward
    upscale_delay_s: float = Field(default=30, ge=0)  # load above the target this long adds a replica
    downscale_delay_s: float = Field(default=600, ge=0)  # load below it this long removes one
    look_back_period_s: float = Field(default=30, gt=0)  # the load is averaged over this window

    @model_validator(mode="after")
    def max_not_below_min(self) -> "AutoscalingConfig":
        if self.max_replicas < self.min_replicas:
            raise ValueError(f"max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})")
        return self


class TargetConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str = DEFAULT_MODEL
    dtype: str = "float32"
    num_gpus: float | None = Field(default=None, ge=0)  # per replica; None: 1 when the cluster has GPUs
    resources: dict[str, float] = {}  # custom Ray resources per replica, e.g. {specfleet_target: 1} (a node type)
    replicas: int = Field(default=1, ge=1)  # target replicas (each loads the target; they pool what they learn)
    autoscaling: AutoscalingConfig | None = None  # Serve scales the replicas instead (`replicas` then stays 1)

    @model_validator(mode="after")
    def replicas_or_autoscaling(self) -> "TargetConfig":
        if self.autoscaling is not None and self.replicas != 1:
            raise ValueError("give replicas (--target-replicas) or autoscaling (--target-autoscaling), not both")
        return self

    @field_validator("dtype")
    @classmethod
    def known_dtype(cls, value: str) -> str:
        return _one_of(value, sorted(DTYPES))


class DrafterConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    kind: str
    model: str | None = None  # hf: the draft model; eagle: its head directory (default: the one trained for the target)
    num_layers: int | None = Field(default=None, ge=1)
    num_gpus: float | None = Field(default=None, ge=0)  # None: 1 when the cluster has GPUs (0 for `none`)
    num_cpus: float = Field(default=0.0, ge=0)
    resources: dict[str, float] = {}  # custom Ray resources, e.g. {specfleet_drafter: 1} (a node type)

    @field_validator("name")
    @classmethod
    def not_the_ensembles_name(cls, value: str) -> str:
        if value == ENSEMBLE:
            raise ValueError(f"{ENSEMBLE!r} names the `ensemble` verification mode's combined draft; choose another name")
        return value

    @field_validator("kind")
    @classmethod
    def known_kind(cls, value: str) -> str:
        if not is_drafter_kind(value):
            raise ValueError(f"must be one of {list(DRAFTER_KINDS)} or a specialist retrieval-<task> / distill-<task>")
        return value

    @model_validator(mode="after")
    def model_drafter_needs_a_model(self) -> "DrafterConfig":
        if self.kind == "hf" and not self.model:
            raise ValueError("an hf drafter needs `model`")
        return self


class PlacementConfig(BaseModel):
    """How the drafters' resource bundles are laid over the nodes (cluster/resources.py)."""

    model_config = ConfigDict(extra="forbid")
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"
    timeout_s: float = Field(default=600.0, gt=0)  # wait this long for the cluster (or its autoscaler) to grant them


class SamplingDefaults(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=0.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)


class ServiceConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    target: TargetConfig = TargetConfig()
    drafters: list[DrafterConfig] = Field(
        default_factory=lambda: [DrafterConfig(name=k, kind=k) for k in default_drafters()],
        min_length=1,
    )
    placement: PlacementConfig = PlacementConfig()
    draft_timeout_s: float = Field(default=DRAFT_TIMEOUT_S, gt=0)  # a drafter answering later costs the round its draft; it is marked down
    request_ttl_s: float = Field(default=REQUEST_TTL_S, gt=0)  # a request without a round for this long is over (its replica died)
    policy: str = DEFAULT_POLICY  # the bandit and its reward (policy/registry.py)
    verify: str = DEFAULT_VERIFY  # how a round's drafts are verified: chosen | counterfactual | tree | ensemble
    k: int = Field(default=K, ge=1, le=MAX_K)
    max_padding: int = Field(default=MAX_PADDING, ge=0, le=16)
    served_model_name: str | None = None
    sampling: SamplingDefaults = SamplingDefaults()
    max_request_bytes: int = Field(default=1 << 20, ge=1024)  # larger HTTP bodies get 413
    max_ongoing_requests: int = Field(default=MAX_BATCH, ge=1)  # requests a target replica batches at once
    max_queued_requests: int = Field(default=64, ge=1)  # requests waiting for a replica; past it 503 + Retry-After
    request_metrics: bool = False  # per-request speculative metrics (per_drafter, timing) in responses: opt-in
    grpc_reflection: bool = False  # gRPC server reflection on Serve's proxy (grpcurl discovery); off: it answers without a key
    api_key_file: str | None = None  # a file of API keys (one a line); keys also come from SPECFLEET_API_KEYS
    api_keys: None = Field(default=None, exclude=True)  # only to refuse keys written into the config

    @model_validator(mode="before")
    @classmethod
    def redact_keys(cls, data: object) -> object:
        """Keys written into the config are refused below; redacted first so no error echoes them."""
        if isinstance(data, dict) and ({"api_keys", "api_key"} & set(data)):
            data = {k: v for k, v in data.items() if k not in ("api_keys", "api_key")} | {"api_keys": "<redacted>"}
        return data

    @field_validator("api_keys", mode="before")
    @classmethod
    def no_keys_in_the_config(cls, value: object) -> None:
        if value is not None:
            raise ValueError("API keys do not belong in the config (it is readable by whoever reads the "
                             "config or Serve's status): set SPECFLEET_API_KEYS or point api_key_file at a key file")
        return None

    @model_validator(mode="after")
    def names_and_policy_are_consistent(self) -> "ServiceConfig":
        names = [d.name for d in self.drafters]
        if len(set(names)) != len(names):
            raise ValueError(f"drafter names must be unique, got {names}")
        parse_policy(self.policy, names, self.verify)  # raises InvalidRequestError naming `policy` or `verify`
        return self

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.target.model
