"""The Ray Serve application `specfleet`: drafter actors, the coordinator actor, the target replica.

`build_app(args)` is the Serve config's `import_path` (deploy/serve_config.yaml): it validates the
args (`ServiceConfig`), resolves the optional API keys (deploy/service/auth.py: SPECFLEET_API_KEYS, a key
file) on the head node, where the secrets live (cluster/head.py), starts the drafter pool (cluster/pool.py: one named actor per drafter, its own GPU on a GPU
cluster, and the coordinator actor `specfleet:coordinator`), then binds the target deployment
(one GPU per replica on a GPU cluster) behind the front deployment `SpecfleetFront`
(deploy/service/front.py), the app's HTTP and gRPC ingress, which forwards every request over a Serve
handle and turns a replica that fails mid-request into a 503 / UNAVAILABLE. Each target replica
generates at most `max_ongoing_requests` at once; at most `max_queued_requests` wait at the front
for one, and the front refuses the rest (503 with Retry-After, RESOURCE_EXHAUSTED). This is the only
place `serve.deployment(...)` and `.bind(...)` run.

The admin token (deploy/service/auth.py `ApiKeys.admin`: SPECFLEET_ADMIN_TOKEN, its file, or
~/.specfleet/admin_token) is resolved here too and travels the same way; without one the admin
API is off.

The keys reach the replica (a separate process) as a deployment init arg holding only their
SHA-256 digests: not in the Serve config YAML (which may only name a key file), not in a
runtime_env (Ray shows env vars in its actor and Serve views), and nothing a log or Serve's
stored state could leak is usable as a key. Rotating keys = redeploying the app.

`serve_forever` backs `specfleet serve`: a local Ray bound to 127.0.0.1, the config's drafters plus
those of `--pool` (`specialists`: every specialist built here), HTTP on the given host/port, gRPC (Serve's gRPC proxy, same app, metadata `application: specfleet`) on 127.0.0.1
at the given port, an admin token created on first start when none is configured
(~/.specfleet/admin_token, 0600), and a clean shutdown on Ctrl-C / SIGTERM (exit 0, no Ray process
left: its handlers are re-installed over Ray's once Ray is up).
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import yaml

from cluster.head import on_head
from cluster.local import connect, listening_hosts, shutdown
from cluster.placement import cluster_gpus
from cluster.pool import start_pool, stop_pool
from cluster.resources import target_gpus
from deploy.config import ServiceConfig
from deploy.service.auth import ApiKeys, ensure_admin_token, service_keys
from deploy.service.front import SpecfleetFront, front_app
from deploy.service.server import SpecfleetServer

APP_NAME = "specfleet"
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "serve_config.yaml"
DEFAULT_GRPC_PORT = 9000
# Generated from deploy/service/proto/specfleet.proto at install; Serve's gRPC proxy imports it.
GRPC_SERVICER = "deploy.service.proto.specfleet_pb2_grpc.add_SpecfleetServicer_to_server"
LOOPBACK_HOSTS = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}
FRONT_MAX_ONGOING = 1024  # the front only waits on replicas; they queue what they cannot take yet


def build_app(args: dict):
    from ray import serve

    config = ServiceConfig.model_validate(args or {})
    # read where the secrets live, the head node (cluster/head.py), before any actor starts: fail fast
    api_keys, admin_keys = on_head(service_keys, config.api_key_file)
    start_pool(config)
    num_gpus = target_gpus(config.target.num_gpus, cluster_gpus())
    scaling = {"num_replicas": config.target.replicas}
    if autoscaling := config.target.autoscaling:  # Serve wants its window longer than its metrics interval
        scaling = {"autoscaling_config": autoscaling.model_dump() | {
            "metrics_interval_s": min(10.0, autoscaling.look_back_period_s / 2)}}
    target = serve.deployment(name="SpecfleetServer", **scaling, max_ongoing_requests=config.max_ongoing_requests,
                              max_queued_requests=config.max_queued_requests, ray_actor_options={
        "num_cpus": 0, "num_gpus": num_gpus, "resources": config.target.resources})(SpecfleetServer)
    front = serve.deployment(name="SpecfleetFront", max_ongoing_requests=FRONT_MAX_ONGOING,
                             ray_actor_options={"num_cpus": 0})(serve.ingress(front_app)(SpecfleetFront))
    replica = target.bind(config.model_dump(), coordinator="actor", api_keys=api_keys, admin_keys=admin_keys)
    return front.bind(replica, config.max_request_bytes, config.model_name, api_keys=api_keys, admin_keys=admin_keys,
                      pool_config=config.model_dump())


def serve_config_yaml(path: str | Path, args: dict, host: str, port: int) -> str:
    """The Serve config at `path` with the specfleet application's args replaced by `args` and HTTP
    on host:port: what `specfleet serve --print-config` prints for `serve deploy` on a cluster."""
    ServiceConfig.model_validate(args)  # errors name the field (and so the flag)
    document = yaml.safe_load(Path(path).read_text()) or {}
    for app in document.get("applications", []):
        if app.get("name") == APP_NAME:
            app["args"] = args
    document["http_options"] = (document.get("http_options") or {}) | {"host": host, "port": port}
    return yaml.safe_dump(document, sort_keys=False)


def load_serve_config(path: str | Path) -> tuple[dict, dict]:
    """-> (the specfleet application's args, http_options) from a Serve config file."""
    document = yaml.safe_load(Path(path).read_text()) or {}
    apps = [a for a in document.get("applications", []) if a.get("name") == APP_NAME]
    if not apps:
        raise ValueError(f"{path}: no application named {APP_NAME!r}")
    return apps[0].get("args") or {}, document.get("http_options") or {}


def start_local_service(args: dict, host: str = "127.0.0.1", port: int = 8000, grpc_port: int | None = None,
                        address: str | None = None, quiet_ray: bool = True) -> str:
    """Start Ray (127.0.0.1; quiet unless `quiet_ray` is False: cluster/local.py), or join the
    cluster at `address`, and the app on host:port (one HTTP proxy, on the head node), plus gRPC
    on 127.0.0.1:grpc_port when given (a local Ray only); -> the base URL. Pair with stop_local_service."""
    from ray import serve

    config = ServiceConfig.model_validate(args or {})
    ApiKeys.resolve(os.environ, config.api_key_file)  # fail before Ray starts
    with_grpc = grpc_port is not None
    if with_grpc and address:
        raise ValueError("gRPC on 127.0.0.1 needs a local Ray (its loopback hook is installed at start)")
    connect(address, grpc_loopback=with_grpc, quiet=quiet_ray)
    grpc_options = {"port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER],
                    "enable_reflection": config.grpc_reflection} if with_grpc else None
    serve.start(http_options={"host": host, "port": port}, grpc_options=grpc_options, proxy_location="HeadOnly")
    if with_grpc and not listening_hosts(grpc_port) <= LOOPBACK_HOSTS:
        serve.shutdown()  # e.g. Ray was already running without the loopback hook
        raise RuntimeError(f"Serve's gRPC proxy listens on {sorted(listening_hosts(grpc_port))}, not only "
                           "127.0.0.1; refusing to serve (start specfleet on a fresh local Ray)")
    serve.run(build_app(args), name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}"


def stop_local_service(args: dict) -> None:
    import ray
    from ray import serve

    if not ray.is_initialized():  # nothing started (serve.shutdown would start a Ray to find out)
        return
    try:
        serve.shutdown()
    finally:
        stop_pool(ServiceConfig.model_validate(args or {}))
        shutdown()


def with_pool(args: dict, pool: str) -> dict:
    """The app's args with the pool's drafters (e.g. `specialists`) added after the config's own."""
    from actors.pool import pool_drafters

    config = ServiceConfig.model_validate(args)
    extra = pool_drafters(pool, config.target.model)
    if pool == "default":
        return args
    drafters = [d.model_dump(exclude_defaults=True) for d in config.drafters]
    present = {d["name"] for d in drafters}
    return args | {"drafters": drafters + [{"name": n, "kind": n} for n in extra if n not in present]}


def serve_forever(args: dict, host: str = "127.0.0.1", port: int = 8000,
                  grpc_port: int = DEFAULT_GRPC_PORT, pool: str = "default") -> None:
    """`args`: the application's args (load_serve_config's, with `specfleet serve`'s flags written over)."""
    args = with_pool(args, pool)
    config = ServiceConfig.model_validate(args)
    ApiKeys.resolve(os.environ, config.api_key_file)  # a bad key setting stops here, before Ray starts
    if created := ensure_admin_token(os.environ):
        print(f"specfleet: created the admin token {created} (0600) for `specfleet drafters`", flush=True)
    stop = threading.Event()

    def on_signal(*_) -> None:
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        url = start_local_service(args, host, port, grpc_port)
        for sig in (signal.SIGINT, signal.SIGTERM):  # Ray's own handlers (a SIGTERM stack dump) replaced theirs
            signal.signal(sig, on_signal)
        drafters = ",".join(d.name for d in config.drafters)
        print(f"specfleet: serving {config.model_name} on {url}/v1 and gRPC 127.0.0.1:{grpc_port} "
              f"(policy {config.policy}, verify {config.verify}, drafters {drafters}; Ctrl-C to stop)", flush=True)
        stop.wait()
    finally:
        stop_local_service(args)
