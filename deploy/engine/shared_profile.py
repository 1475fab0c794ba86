"""A target's forward-cost profile, measured once per kind of machine and shared by the replicas
that run on it, through the coordinator.

The engine prices forwards from the target's measured profile (`TargetModel.forward_profile`,
`batch_profile`; deploy/engine/cost_model.py). Measuring it takes 13 s on an idle 2-core CPU and
about 60 s beside a replica that serves, which also skews it (every size timed slower, unevenly),
so a replacement started under load would both come up late and price its forwards wrongly.
Replicas of one model and dtype on like hardware (`profile_key`: the device's name, torch's
threads, the model, the dtype, torch's version) have one profile: the first replica to ask
measures it and publishes it (`publish_profile`); the others wait for it (at most PROFILE_WAIT_S)
and adopt it (`adopt_shared_profile`), then only measure what it lacks. Each replica's running
corrections (ForwardCosts.observe, BatchCosts.observe) still follow its own forwards.

`ProfileBoard` is the coordinator's side: the profiles by key, and which replica is measuring
one (a claim older than CLAIM_S is a replica that died measuring: the next to ask measures).
The board is not checkpointed: a restarted coordinator has new replicas measure again.
"""
from __future__ import annotations

import json
import logging
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the coordinator's board needs neither torch nor the target
    import torch

    from deploy.engine.target import TargetModel

PROFILE_WAIT_S = 120.0  # a replica waits this long for a peer measuring its profile, then measures itself
POLL_S = 1.0
CLAIM_S = 180.0  # a measurement claimed longer ago than this is abandoned (its replica died)
logger = logging.getLogger("specfleet")


def device_name(device: torch.device) -> str:
    """The hardware a forward runs on: the GPU's name, or the CPU's model and torch's threads."""
    import torch

    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        model = next((line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines()
                      if line.startswith("model name")), model)
    return f"{model} x{torch.get_num_threads()} threads"


def profile_key(target: TargetModel) -> str:
    """Replicas with equal keys time their forwards alike."""
    import torch

    return json.dumps({"model": target.name, "dtype": str(target.model.dtype), "device": device_name(target.device),
                       "torch": torch.__version__}, sort_keys=True)


def adopt_shared_profile(target: TargetModel, ask: Callable[[str, str], dict], claimant: str,
                         wait_s: float = PROFILE_WAIT_S, poll_s: float = POLL_S,
                         clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> bool:
    """Adopt the profile published for `target`'s key (True), or return False when this replica is
    to measure it: it is the first to ask, the peer measuring did not publish within `wait_s`, or
    the coordinator did not answer. `ask(key, claimant)` is the coordinator's `cost_profile`."""
    key, deadline = profile_key(target), clock() + wait_s
    while True:
        try:
            answer = ask(key, claimant)
        except Exception as err:  # noqa: BLE001 - no coordinator to share through: measure here
            logger.warning("no shared cost profile (the coordinator did not answer: %r); measuring it", err)
            return False
        if answer.get("profile"):
            target.adopt_cost_profile(answer["profile"])
            return True
        if answer.get("measure") or clock() >= deadline:
            return False
        sleep(poll_s)


def publish_profile(target: TargetModel, put: Callable[[str, dict], object]) -> None:
    """Publish what this replica's target measured, for the replicas that wait for it or come later."""
    try:
        put(profile_key(target), target.cost_profile())
    except Exception as err:  # noqa: BLE001 - others measure for themselves
        logger.warning("publishing the cost profile failed: %r", err)


class ProfileBoard:
    """The coordinator's profiles by key and the measurements under way."""

    def __init__(self, claim_s: float = CLAIM_S) -> None:
        self.claim_s = claim_s
        self.profiles: dict[str, dict] = {}
        self.claims: dict[str, tuple[str, float]] = {}  # key -> (claimant, when)

    def ask(self, key: str, claimant: str, now: float) -> dict:
        """{"profile": the published one} or {"profile": None, "measure": whether `claimant` is to
        measure it (no one else is, or the one who was has been at it over claim_s)}."""
        if key in self.profiles:
            return {"profile": self.profiles[key], "measure": False}
        holder = self.claims.get(key)
        if holder is None or holder[0] == claimant or now - holder[1] > self.claim_s:
            self.claims[key] = (claimant, now if holder is None or holder[0] != claimant else holder[1])
            return {"profile": None, "measure": True}
        return {"profile": None, "measure": False}

    def put(self, key: str, profile: dict) -> None:
        self.profiles[key] = profile
        self.claims.pop(key, None)
