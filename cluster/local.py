"""Connect to Ray: an existing cluster (`address`) or a local one bound to 127.0.0.1.

Everything specfleet starts lives in the Ray namespace `specfleet`. A local cluster uses Ray's
token authentication, on by default for local clusters since Ray 2.59 (Ray generates the token
in ~/.ray/auth_token). specfleet's clusters (`ray_config.yaml`, `ray start` in the runbook) run
with RAY_AUTH_MODE=token too, so joining one by address turns token mode on in this process
unless RAY_AUTH_MODE says otherwise (the token comes from RAY_AUTH_TOKEN or ~/.ray/auth_token).

A local cluster starts quiet (`quiet=True`): what an idle Ray runs that the service does not use is
turned off or slowed (QUIET_SYSTEM_CONFIG, QUIET_ENV; docs/design.md, "A quiet service"): Ray's own
metrics export (the app serves its Prometheus metrics itself), per-handler event statistics,
task events, a 10 Hz resource report and disk check of a one-node cluster, Serve's 10 Hz control
loop and metrics flush, the dashboard agent's 5-second process sampling. Environment variables
already set win over QUIET_ENV; a cluster joined by address keeps its own settings.

Ray Serve 2.60's gRPC proxy always listens on `[::]:<port>` (all interfaces; `gRPCOptions` has no
host, see ray/serve/_private/grpc_util.py `start_grpc_server`). A local cluster started with
`grpc_loopback=True` installs `bind_grpc_proxy_to_loopback` as Ray's `worker_process_setup_hook`
(a runtime_env field that runs a function in every worker process of the job, the Serve
controller and its proxies included), which makes Serve's gRPC listening address 127.0.0.1.
"""
from __future__ import annotations

import os

NAMESPACE = "specfleet"
LOOPBACK_HOOK = "cluster.local.bind_grpc_proxy_to_loopback"
_WILDCARD_HOSTS = ("[::]", "0.0.0.0", "")
QUIET_SYSTEM_CONFIG = {
    "enable_metrics_collection": False,  # Ray's and Serve's metrics export (the app's /metrics is its own)
    "event_stats": False,  # timing of every handler of every event loop
    "task_events_report_interval_ms": 0,  # task events (`ray list tasks`, the timeline)
    "raylet_report_resources_period_milliseconds": 1000,  # 100 ms
    "local_fs_monitor_interval_ms": 1000,  # 100 ms
}
QUIET_ENV = {  # read by the processes Ray starts, which inherit this process's environment
    "RAY_SERVE_CONTROL_LOOP_INTERVAL_S": "1",  # 0.1 s: deploys and recoveries notice within a second
    "RAY_SERVE_METRICS_EXPORT_INTERVAL_MS": "0",  # a 10 Hz flush in every replica and router; nothing exports
    "REPORTER_UPDATE_INTERVAL_MS": "60000",  # the dashboard agent's process sampling, 5 s
}


def connect(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None,
            grpc_loopback: bool = False, quiet: bool = True) -> None:
    """quiet: start a local cluster with QUIET_SYSTEM_CONFIG and QUIET_ENV (False: Ray's defaults)."""
    if address:  # read when Ray is first imported: set it before
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    else:
        if quiet:
            for name, value in QUIET_ENV.items():
                os.environ.setdefault(name, value)
        ray.init(
            _node_ip_address="127.0.0.1",
            _system_config=dict(QUIET_SYSTEM_CONFIG) if quiet else None,  # a copy: Ray writes into it
            namespace=NAMESPACE,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"worker_process_setup_hook": LOOPBACK_HOOK} if grpc_loopback else None,
        )


def bind_grpc_proxy_to_loopback() -> None:
    """Worker setup hook: Serve's gRPC proxy listens on 127.0.0.1:<port> instead of [::]:<port>.

    Serve starts its gRPC server through `ray.serve._private.default_impl.add_grpc_address`
    (its designated override point, looked up at call time); this wraps it to swap a wildcard
    host for 127.0.0.1. Idempotent.
    """
    from ray.serve._private import default_impl

    add_grpc_address = default_impl.add_grpc_address
    if getattr(add_grpc_address, "loopback_only", False):
        return

    def add_loopback_grpc_address(server, address: str):
        host, _, port = address.rpartition(":")
        return add_grpc_address(server, f"127.0.0.1:{port}" if host in _WILDCARD_HOSTS else address)

    add_loopback_grpc_address.loopback_only = True
    default_impl.add_grpc_address = add_loopback_grpc_address


def listening_hosts(port: int) -> set[str]:
    """The local addresses on which some process listens on TCP `port` (e.g. {'127.0.0.1'})."""
    import psutil

    return {c.laddr.ip for c in psutil.net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port}


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
