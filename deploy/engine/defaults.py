"""The engine's defaults, written once: every layer above (config, CLI, bench, scheduler) reads them here."""
from __future__ import annotations

K = 7  # the most tokens drafted a round
MAX_K = 32  # the largest k a request or config may set
MAX_PADDING = 4  # throwaway positions a forward may be padded with when a larger size is cheaper
MAX_BATCH = 32  # requests a scheduler (a target replica) runs in one iteration
PREFILL_TOKENS = 512  # prompt tokens a scheduler prefills per iteration (longer prompts: in chunks)
