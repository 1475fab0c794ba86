"""`specfleet status` as text: the nodes, where each target replica and drafter runs (its own actor, or
the coordinator), the pool's health.

A replica's FORWARD COSTS are "measured" by it or "adopted" from a peer on like hardware
(deploy/engine/shared_profile.py). `render_status(status)` formats the dict of `cluster.pool.pool_status()` (pure; node ids are
shortened to 8 characters, GPU ids are Ray's, `-` where there is none).
"""
from __future__ import annotations

from collections.abc import Sequence


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> list[str]:
    cells = [list(header)] + [["-" if v in (None, "", []) else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return ["  " + "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]


def _short(node: str | None) -> str | None:
    return node[:8] if node else None


def _gpus(ids: Sequence[str]) -> str:
    return ",".join(ids)


def render_status(status: dict) -> str:
    nodes = status["nodes"]
    lines = [f"policy: {status['policy']}", f"nodes ({sum(n['alive'] for n in nodes)} alive):"]
    lines += _table(("NODE", "IP", "GPUS", "ALIVE"),
                    [(_short(n["node"]), n["node_ip"], f"{n['gpus']:g}", "yes" if n["alive"] else "no") for n in nodes])
    lines.append(f"target replicas ({len(status['replicas'])}):")
    lines += _table(("REPLICA", "NODE", "IP", "GPU", "DEVICE", "FORWARD COSTS"),
                    [(r["replica"], _short(r["node"]), r["node_ip"], _gpus(r["gpu"]), r["device"], r.get("forward_costs"))
                     for r in status["replicas"]])
    lines.append(render_drafters(status["drafters"]))
    return "\n".join(lines)


def render_drafters(drafters: Sequence[dict]) -> str:
    """The drafter table (also `specfleet drafters list`)."""
    lines = [f"drafters ({sum(d['status'] == 'up' for d in drafters)}/{len(drafters)} up):"]
    lines += _table(("NAME", "KIND", "MODEL", "RUNS IN", "NODE", "IP", "GPU", "DEVICE", "STATUS", "PULLS", "ACCEPTANCE"),
                    [(d["name"], d["kind"], d["model"], d.get("runs_in"), _short(d["node"]), d["node_ip"], _gpus(d["gpu"]),
                      d["device"], d["status"], d["pulls"], None if d["acceptance"] is None else f"{d['acceptance']:.2f}")
                     for d in drafters])
    return "\n".join(lines)
