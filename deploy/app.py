"""The Ray Serve application `specfleet`: drafter actors, the coordinator actor, the target replica.

`build_app(args)` is the Serve config's `import_path` (deploy/serve_config.yaml): it validates the
args (`ServiceConfig`), starts one named actor per drafter (`specfleet:drafter:<name>`, its own
GPU when the config asks for one) and the coordinator actor (`specfleet:coordinator`), then binds
the target deployment with the FastAPI ingress. This is the only place `serve.deployment(...)`
and `.bind(...)` run. `serve_forever` backs `specfleet serve`: a local Ray bound to 127.0.0.1,
HTTP on the given host/port, clean shutdown on Ctrl-C / SIGTERM.
"""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import yaml

from actors.models import model_vocab_size
from actors.remote import DRAFTER_PREFIX, DrafterSpec, start_drafter_actor
from cluster.local import NAMESPACE, connect, shutdown
from deploy.config import ServiceConfig
from deploy.server import SpecfleetServer, app
from policy.coordinator import COORDINATOR_NAME, start_coordinator_actor

APP_NAME = "specfleet"
DEFAULT_CONFIG = Path(__file__).parent / "serve_config.yaml"


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
    start_pool(config)
    deployment = serve.deployment(name="SpecfleetServer", ray_actor_options={"num_cpus": 0})(
        serve.ingress(app)(SpecfleetServer))
    return deployment.bind(config.model_dump(), coordinator="actor")


def load_serve_config(path: str | Path) -> tuple[dict, dict]:
    """-> (the specfleet application's args, http_options) from a Serve config file."""
    document = yaml.safe_load(Path(path).read_text()) or {}
    apps = [a for a in document.get("applications", []) if a.get("name") == APP_NAME]
    if not apps:
        raise ValueError(f"{path}: no application named {APP_NAME!r}")
    return apps[0].get("args") or {}, document.get("http_options") or {}


def start_local_service(args: dict, host: str = "127.0.0.1", port: int = 8000) -> str:
    """Start Ray (127.0.0.1) and the app on host:port; -> the base URL. Pair with stop_local_service."""
    from ray import serve

    connect()
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_app(args), name=APP_NAME, route_prefix="/")
    return f"http://{host}:{port}"


def stop_local_service(args: dict) -> None:
    from ray import serve

    try:
        serve.shutdown()
    finally:
        stop_pool(ServiceConfig.model_validate(args or {}))
        shutdown()


def serve_forever(config_path: str | Path = DEFAULT_CONFIG, host: str = "127.0.0.1", port: int = 8000) -> None:
    args, _ = load_serve_config(config_path)
    config = ServiceConfig.model_validate(args)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        url = start_local_service(args, host, port)
        print(f"specfleet: serving {config.model_name} on {url}/v1 (Ctrl-C to stop)", flush=True)
        stop.wait()
    finally:
        stop_local_service(args)
