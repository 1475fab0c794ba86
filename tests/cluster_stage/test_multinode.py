"""A multi-node cluster on one machine: a head and a worker started with `ray start` on 127.0.0.1,
each declaring logical GPUs. The service's drafters land one per GPU across both nodes (placement
strategy SPREAD), a model drafter runs on the CPU although Ray gave it a GPU id, and a node added
later receives the drafter added after it. Runs in `make test`'s second (cluster) stage: it ends
with `ray stop`, which stops every Ray process on this machine."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.no_draft import NO_DRAFT
from tests.conftest import CHAT_PROMPTS, chat_text, free_ports, plain_text

pytestmark = [pytest.mark.cluster, pytest.mark.model]

RAY = str(Path(sys.executable).with_name("ray"))
SPECFLEET = str(Path(sys.executable).with_name("specfleet"))
MAX_TOKENS = 24
NODE_FLAGS = ["--node-ip-address=127.0.0.1", "--num-cpus=2", "--object-store-memory=200000000",
              "--disable-usage-stats"]
ARGS = {
    "policy": "metasd-ucb", "k": 7, "placement": {"strategy": "SPREAD", "timeout_s": 120},
    "target": {"model": "smollm2-135m"},
    # the lookups ask a GPU here (by default they are hosted by the coordinator and need none), so that
    # three drafter actors spread over the GPUs
    "drafters": [{"name": "ngram", "kind": "ngram", "num_gpus": 1}, {"name": "suffix", "kind": "suffix", "num_gpus": 1},
                 {"name": "early-exit", "kind": "hf", "model": "smollm2-135m", "num_layers": 2},
                 {"name": NO_DRAFT, "kind": NO_DRAFT}],
}


def ray_cli(*args: str) -> None:
    """The ray CLI, with token authentication like every specfleet cluster (see the runbook)."""
    env = os.environ | {"RAY_AUTH_MODE": "token"}
    done = subprocess.run([RAY, *args], capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, f"ray {' '.join(args)} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"


def alive_nodes() -> set[str]:
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def wait_for_nodes(count: int, timeout_s: float = 60.0) -> set[str]:
    deadline = time.monotonic() + timeout_s
    while len(nodes := alive_nodes()) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(nodes)} of {count} nodes alive after {timeout_s} s")
        time.sleep(0.5)
    return nodes


@pytest.fixture(scope="module")
def admin_env(tmp_path_factory):
    """The admin token, in a file named by SPECFLEET_ADMIN_TOKEN_FILE (for the service and the CLI)."""
    token_file = tmp_path_factory.mktemp("admin") / "admin_token"
    token_file.write_text(secrets.token_urlsafe(24) + "\n")
    with pytest.MonkeyPatch.context() as env:
        env.delenv("SPECFLEET_ADMIN_TOKEN", raising=False)
        env.setenv("SPECFLEET_ADMIN_TOKEN_FILE", str(token_file))
        yield os.environ.copy()


@pytest.fixture(scope="module")
def cluster(admin_env):
    """-> (Ray address, base URL) of a head (2 GPUs) + worker (2 GPUs) cluster serving specfleet."""
    import ray

    from deploy.service.app import start_local_service, stop_local_service

    gcs_port, http_port = free_ports(2)
    address = f"127.0.0.1:{gcs_port}"
    ray_cli("get-auth-token", "--generate")  # ~/.ray/auth_token, shared by the nodes and the clients
    try:
        ray_cli("start", "--head", f"--port={gcs_port}", "--num-gpus=2", "--include-dashboard=false", *NODE_FLAGS)
        ray_cli("start", f"--address={address}", "--num-gpus=2", *NODE_FLAGS)
        url = start_local_service(ARGS, port=http_port, address=address)
        wait_for_nodes(2)
        yield address, url
    finally:
        try:
            stop_local_service(ARGS)
        finally:
            ray.shutdown()
            subprocess.run([RAY, "stop", "--force"], capture_output=True, timeout=120)


@pytest.fixture(scope="module")
def plain(target):
    return plain_text(target, CHAT_PROMPTS[0], MAX_TOKENS)


def ask(url: str) -> str:
    return chat_text(url, CHAT_PROMPTS[0], MAX_TOKENS)


def specfleet(*args: str, env: dict) -> str:
    done = subprocess.run([SPECFLEET, *args], capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, f"specfleet {' '.join(args)} failed:\n{done.stdout}\n{done.stderr[-3000:]}"
    return done.stdout


def test_drafters_land_one_per_logical_gpu_across_both_nodes(cluster):
    from cluster.pool import pool_status

    drafters = {d["name"]: d for d in pool_status()["drafters"]}
    assert all(d["status"] == "up" for d in drafters.values())
    on_gpus = [d for d in drafters.values() if d["gpu"]]
    assert sorted(d["name"] for d in on_gpus) == ["early-exit", "ngram", "suffix"]
    assert all(len(d["gpu"]) == 1 for d in on_gpus)
    assert len({(d["node"], d["gpu"][0]) for d in on_gpus}) == 3  # a GPU of its own each
    assert len({d["node"] for d in on_gpus}) == 2  # spread over both nodes
    assert drafters[NO_DRAFT]["gpu"] == []  # the no-draft arm needs no GPU


def test_a_model_drafter_given_a_gpu_id_without_cuda_runs_on_the_cpu(cluster):
    from cluster.pool import pool_status

    early_exit = next(d for d in pool_status()["drafters"] if d["name"] == "early-exit")
    assert early_exit["gpu"] and early_exit["device"] == "cpu"


def test_the_target_replica_takes_the_remaining_gpu(cluster):
    from cluster.pool import pool_status

    state = pool_status()
    [replica] = state["replicas"]
    held = {(d["node"], d["gpu"][0]) for d in state["drafters"] if d["gpu"]}
    assert len(replica["gpu"]) == 1 and (replica["node"], replica["gpu"][0]) not in held
    assert replica["device"] == "cpu"


def test_the_multi_node_service_answers_exactly_like_plain_decoding(cluster, plain):
    _, url = cluster
    assert ask(url) == plain


def test_a_drafter_added_after_a_new_node_lands_on_the_new_node_and_becomes_an_arm(cluster, plain, admin_env):
    address, url = cluster
    before = alive_nodes()
    ray_cli("start", f"--address={address}", "--num-gpus=1", *NODE_FLAGS)  # the new drafter node
    new_node = (wait_for_nodes(len(before) + 1) - before).pop()

    specfleet("drafters", "add", "ngram-2", "--kind", "ngram", "--num-gpus", "1", "--url", url, env=admin_env)
    listed = {d["name"]: d for d in json.loads(specfleet("drafters", "list", "--json", "--url", url, env=admin_env))}
    assert (listed["ngram-2"]["node"], listed["ngram-2"]["status"]) == (new_node, "up")
    assert len(listed["ngram-2"]["gpu"]) == 1

    assert ask(url) == plain  # still exact with the grown pool
    report = json.loads(specfleet("status", "--address", address, "--json", env=admin_env))  # the Ray-side view
    assert {n["node"] for n in report["nodes"] if n["alive"]} == before | {new_node}
    assert "ngram-2" in {d["name"] for d in report["drafters"]}


def test_a_removed_drafter_leaves_the_pool_and_frees_its_gpu(cluster, plain, admin_env):
    import ray

    _, url = cluster
    free_before = ray.available_resources().get("GPU", 0.0)
    specfleet("drafters", "remove", "ngram-2", "--url", url, env=admin_env)
    listed = json.loads(specfleet("drafters", "list", "--json", "--url", url, env=admin_env))
    assert "ngram-2" not in {d["name"] for d in listed}
    deadline = time.monotonic() + 30
    while ray.available_resources().get("GPU", 0.0) < free_before + 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert ray.available_resources().get("GPU", 0.0) == free_before + 1
    assert ask(url) == plain
