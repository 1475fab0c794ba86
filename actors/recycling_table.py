"""Token Recycling's table: for each token, the target's top-k next tokens with their probabilities.

Row `a` holds the k tokens the target predicted most likely after an input token `a` (the last
context it was seen in), best first, with their probabilities (temperature 1); `EMPTY` (-1) marks
a slot with no candidate. It is a first-order table (keyed on one token, no context), as in Token
Recycling (arXiv 2408.08696).

Two layers, looked up in order:

- a per-tenant **overlay**, written online from the target's verification forwards (`write`):
  every verified position's input token gets a new row (the whole row replaced: the latest
  context wins, as in the paper), and so does the pair (previous token, input token), a row of
  one more token of context, looked up first where the drafter knows the previous token. It is bounded: at most `max_rows` rows per tenant (the least
  recently written go first) and `max_tenants` tenants (the least recently active go first).
  A tenant is the request's `cache_salt` (the service sets it per API key; "" without one), so
  nothing one tenant's requests write ever drafts for another;
- a shared, read-only **prior** (`ids` [V, k] int32, `probs` [V, k] float16), built offline from
  the target's own predictions over a corpus (deploy/specialists/recycling_prior.py) and shipped
  as a file with its manifest (`load_prior`, `save_prior`). No request ever writes it.

A prior is found per target like the eagle head: one built on this machine
(`$SPECFLEET_CACHE/recycling/<target>`) before the one the repository ships
(`actors/data/recycling/<target>`); `find_prior` -> its directory or None.

`row(tenant, token, previous)` -> (ids, probs) of the candidates (EMPTY slots dropped), or None:
the overlay's pair row, else its token row, else the prior's.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from actors.models import cache_root, target_key

EMPTY = -1  # a slot with no candidate (never token 0: an unseen token drafts nothing)
TOP_K = 8  # candidates kept per row (the paper's)
TABLE_FILE, MANIFEST = "table.safetensors", "manifest.json"
SHIPPED_PRIORS = Path(__file__).resolve().parent / "data" / "recycling"  # <target>/table.safetensors + manifest.json
MAX_ROWS = 16_384  # rows a tenant's overlay holds (about 0.5 MB)
MAX_TENANTS = 256


@dataclass(frozen=True)
class Prior:
    """The shared read-only layer: ids [V, k] int32 (EMPTY where none), probs [V, k] float32."""

    ids: np.ndarray
    probs: np.ndarray
    manifest: dict

    def __post_init__(self) -> None:
        if self.ids.shape != self.probs.shape or self.ids.ndim != 2:
            raise ValueError(f"a prior needs ids and probs of one shape [V, k], got {self.ids.shape}, {self.probs.shape}")
        self.ids.setflags(write=False)
        self.probs.setflags(write=False)

    @property
    def vocab_size(self) -> int:
        return int(self.ids.shape[0])



def shipped_prior(target: str) -> Path:
    """Where the repository keeps the prior of the target named `target` (as --model gives it)."""
    return SHIPPED_PRIORS / target_key(target)


def prior_dir(target: str) -> Path:
    """Where `specfleet recycling-prior` writes a prior it builds for `target` (found before the shipped one)."""
    return cache_root() / "recycling" / target_key(target)


def is_prior_dir(path: Path) -> bool:
    return (path / TABLE_FILE).is_file() and (path / MANIFEST).is_file()


def find_prior(target: str) -> Path | None:
    """The prior for `target`: one built on this machine, else the one the repository ships, else None."""
    return next((path for path in (prior_dir(target), shipped_prior(target)) if is_prior_dir(path)), None)


def empty_prior(vocab_size: int, k: int = TOP_K) -> Prior:
    return Prior(np.full((vocab_size, k), EMPTY, dtype=np.int32), np.zeros((vocab_size, k), dtype=np.float32), {})


def save_prior(prior: Prior, directory: Path) -> None:
    """`table.safetensors` (ids int32, probs float16) and `manifest.json`, written whole."""
    import torch
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    save_file({"ids": torch.from_numpy(np.array(prior.ids, dtype=np.int32)),  # copies: the prior is read-only
               "probs": torch.from_numpy(np.array(prior.probs, dtype=np.float16))},
              str(directory / TABLE_FILE))
    (directory / MANIFEST).write_text(json.dumps(prior.manifest, indent=1) + "\n")


def load_prior(directory: Path) -> Prior:
    from safetensors.numpy import load_file

    tensors = load_file(str(directory / TABLE_FILE))
    manifest = json.loads((directory / MANIFEST).read_text())
    return Prior(tensors["ids"].astype(np.int32), tensors["probs"].astype(np.float32), manifest)


class RecyclingTable:
    def __init__(self, prior: Prior, max_rows: int = MAX_ROWS, max_tenants: int = MAX_TENANTS) -> None:
        self.prior, self.max_rows, self.max_tenants = prior, max_rows, max_tenants
        self.k = int(prior.ids.shape[1])
        # per tenant: token -> row, and (previous token, token) -> row
        self._overlays: OrderedDict[str, OrderedDict[int | tuple[int, int], tuple[np.ndarray, np.ndarray]]] = OrderedDict()

    @property
    def vocab_size(self) -> int:
        return self.prior.vocab_size

    def row(self, tenant: str, token: int, previous: int = EMPTY) -> tuple[np.ndarray, np.ndarray] | None:
        """The candidates after `token` (preceded by `previous`, EMPTY: unknown) for this tenant: its
        overlay's row of the pair, else of the token, else the prior's (None: none)."""
        overlay = self._overlays.get(tenant)
        if overlay is not None:
            found = overlay.get((previous, token)) if previous != EMPTY else None
            if found is None:
                found = overlay.get(token)
            if found is not None:
                return found
        if not 0 <= token < self.vocab_size:
            return None
        ids = self.prior.ids[token]
        kept = ids != EMPTY
        if not kept[0]:
            return None
        return ids[kept], self.prior.probs[token][kept]

    def write(self, tenant: str, tokens: Sequence[int] | np.ndarray, ids: np.ndarray, probs: np.ndarray,
              previous: Sequence[int] | np.ndarray | None = None) -> None:
        """The target's predictions after each of `tokens` (ids [n, k'], probs [n, k'], best first;
        previous [n]: the token before each, EMPTY where unknown): each token's row, and each
        (previous, token) pair's, in the tenant's overlay replaced, in order (a later one wins)."""
        overlay = self._overlays.get(tenant)
        if overlay is None:
            overlay = self._overlays[tenant] = OrderedDict()
            while len(self._overlays) > self.max_tenants:
                self._overlays.popitem(last=False)
        else:
            self._overlays.move_to_end(tenant)
        ids = np.asarray(ids, dtype=np.int32)[:, : self.k]
        probs = np.asarray(probs, dtype=np.float32)[:, : self.k]
        tokens = np.asarray(tokens).tolist()
        before = [EMPTY] * len(tokens) if previous is None else np.asarray(previous).tolist()
        for token, prior_token, row_ids, row_probs in zip(tokens, before, ids, probs):
            for key in ((token,) if prior_token == EMPTY else (token, (prior_token, token))):
                overlay.pop(key, None)
                overlay[key] = (row_ids, row_probs)
        while len(overlay) > self.max_rows:
            overlay.popitem(last=False)

    def overlay_rows(self, tenant: str) -> int:
        overlay = self._overlays.get(tenant)
        return len(overlay) if overlay is not None else 0
