"""The Ray Serve application `specfleet`: drafter actors, the coordinator actor, the target replica.

`build_app(args)` is the Serve config's `import_path` (deploy/serve_config.yaml): it validates the
args (`ServiceConfig`), resolves the optional API keys (deploy/auth.py: SPECFLEET_API_KEYS, a key
file), starts one named actor per drafter (`specfleet:drafter:<name>`, its own GPU when the config
asks for one) and the coordinator actor (`specfleet:coordinator`), then binds the target
deployment with the FastAPI ingress; the same deployment serves the gRPC methods. This is the
only place `serve.deployment(...)` and `.bind(...)` run.

The keys reach the replica (a separate process) as a deployment init arg holding only their
SHA-256 digests: not in the Serve config YAML (which may only name a key file), not in a
runtime_env (Ray shows env vars in its actor and Serve views), and nothing a log or Serve's
stored state could leak is usable as a key. Rotating keys = redeploying the app.

`serve_forever` backs `specfleet serve`: a local Ray bound to 127.0.0.1, HTTP on the given
host/port, gRPC (Serve's gRPC proxy, same app, metadata `application: specfleet`) on 127.0.0.1
at the given port, clean shutdown on Ctrl-C / SIGTERM.
"""
from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import yaml

from actors.models import model_vocab_size
from actors.remote import DRAFTER_PREFIX, DrafterSpec, start_drafter_actor
from cluster.local import NAMESPACE, connect, listening_hosts, shutdown
from deploy.auth import ApiKeys
from deploy.config import ServiceConfig
from deploy.server import SpecfleetServer, app
from policy.coordinator import COORDINATOR_NAME, start_coordinator_actor

APP_NAME = "specfleet"
DEFAULT_CONFIG = Path(__file__).parent / "serve_config.yaml"
DEFAULT_GRPC_PORT = 9000
# Generated from deploy/proto/specfleet.proto at install; Serve's gRPC proxy imports it.
GRPC_SERVICER = "deploy.proto.specfleet_pb2_grpc.add_SpecfleetServicer_to_server"
LOOPBACK_HOSTS = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def start_pool(config: ServiceConfig) -> None:
    """Start (or reuse, by name) the drafter actors and the coordinator actor."""
    import ray

    try:
        ray.get_actor(COORDINATOR_NAME, namespace=NAMESPACE)
        return  # a redeploy of the same app keeps its pool and its bandit statistics
    except ValueError:
        pass
    vocab = model_vocab_size(config.target.model)
    cluster_gpus = ray.cluster_resources().get("GPU", 0)
    handles = {}
    for d in config.drafters:
        num_gpus = d.num_gpus if d.num_gpus is not None else (1.0 if d.model and cluster_gpus >= 1 else 0.0)
        spec = DrafterSpec(d.name, d.kind, d.model, d.num_layers, config.target.dtype, num_gpus, d.num_cpus)
        handles[d.name] = start_drafter_actor(spec, vocab)
    ray.get([h.open_sessions.remote() for h in handles.values()])  # fail fast if a drafter cannot start
    coordinator = start_coordinator_actor(handles, config.policy)
    ray.get(coordinator.stats.remote())


def stop_pool(config: ServiceConfig) -> None:
    import ray

    for name in [COORDINATOR_NAME] + [DRAFTER_PREFIX + d.name for d in config.drafters]:
        try:
            ray.kill(ray.get_actor(name, namespace=NAMESPACE))
        except ValueError:
            pass


def build_app(args: dict):
    from ray import serve

    config = ServiceConfig.model_validate(args or {})
    api_keys = ApiKeys.resolve(os.environ, config.api_key_file)  # before any actor starts: fail fast
    start_pool(config)
    deployment = serve.deployment(name="SpecfleetServer", ray_actor_options={"num_cpus": 0})(
        serve.ingress(app)(SpecfleetServer))
    return deployment.bind(config.model_dump(), coordinator="actor", api_keys=api_keys)


def load_serve_config(path: str | Path) -> tuple[dict, dict]:
    """-> (the specfleet application's args, http_options) from a Serve config file."""
    document = yaml.safe_load(Path(path).read_text()) or {}
    apps = [a for a in document.get("applications", []) if a.get("name") == APP_NAME]
    if not apps:
        raise ValueError(f"{path}: no application named {APP_NAME!r}")
    return apps[0].get("args") or {}, document.get("http_options") or {}


def start_local_service(args: dict, host: str = "127.0.0.1", port: int = 8000, grpc_port: int | None = None) -> str:
    """Start Ray (127.0.0.1) and the app on host:port, plus gRPC on 127.0.0.1:grpc_port when given;
    -> the base URL. Pair with stop_local_service."""
    from ray import serve

    ApiKeys.resolve(os.environ, ServiceConfig.model_validate(args or {}).api_key_file)  # fail before Ray starts
    with_grpc = grpc_port is not None
    connect(grpc_loopback=with_grpc)
    grpc_options = {"port": grpc_port, "grpc_servicer_functions": [GRPC_SERVICER]} if with_grpc else None
    serve.start(http_options={"host": host, "port": port}, grpc_options=grpc_options)
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


def serve_forever(config_path: str | Path = DEFAULT_CONFIG, host: str = "127.0.0.1", port: int = 8000,
                  grpc_port: int = DEFAULT_GRPC_PORT) -> None:
    args, _ = load_serve_config(config_path)
    config = ServiceConfig.model_validate(args)
    ApiKeys.resolve(os.environ, config.api_key_file)  # a bad key setting stops here, before Ray starts
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        url = start_local_service(args, host, port, grpc_port)
        print(f"specfleet: serving {config.model_name} on {url}/v1 and gRPC 127.0.0.1:{grpc_port} "
              f"(Ctrl-C to stop)", flush=True)
        stop.wait()
    finally:
        stop_local_service(args)
