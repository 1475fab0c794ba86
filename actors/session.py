"""Per-request drafter state keyed by request id, bounded in count and age.

`SessionStore.extend(session, delta)` appends committed tokens and returns the session's state;
sessions idle for longer than `ttl_s`, or the least recently used beyond `max_sessions`, are
evicted, so a request that never calls `release` cannot leak memory.
"""
from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Session:
    tokens: list[int] = field(default_factory=list)  # committed context seen so far
    state: Any = None  # drafter-specific (KV cache, generator, ...)
    last_used: float = field(default_factory=time.monotonic)


class SessionStore:
    def __init__(self, ttl_s: float = 600.0, max_sessions: int = 1024) -> None:
        self.ttl_s = ttl_s
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def extend(self, session: str, delta: Sequence[int], new_state: Callable[[], Any] | None = None) -> Session:
        now = time.monotonic()
        entry = self._sessions.get(session)
        if entry is None:
            self._evict(now)
            entry = Session(state=new_state() if new_state else None)
            self._sessions[session] = entry
        else:
            self._sessions.move_to_end(session)
        entry.tokens.extend(int(t) for t in delta)
        entry.last_used = now
        return entry

    def pop(self, session: str) -> Session | None:
        return self._sessions.pop(session, None)

    def _evict(self, now: float) -> None:
        while self._sessions:
            oldest_key, oldest = next(iter(self._sessions.items()))
            if now - oldest.last_used > self.ttl_s or len(self._sessions) >= self.max_sessions:
                del self._sessions[oldest_key]
            else:
                break
