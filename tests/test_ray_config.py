"""ray_config.yaml (the cloud cluster) and cluster/loopback.yaml (the same steps on 127.0.0.1) pass
Ray's own cluster-config validator, and carry what the deployment path relies on."""
import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CONFIGS = {"cloud": REPO / "ray_config.yaml", "loopback": REPO / "cluster" / "loopback.yaml"}


def load(name: str) -> dict:
    return yaml.safe_load(CONFIGS[name].read_text())


def validated(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))  # what `ray up` does: defaults, then the schema
    validate_config(prepared)
    return prepared


@pytest.mark.parametrize("name", CONFIGS)
def test_the_cluster_config_passes_rays_validator(name):
    validated(load(name))


def test_the_validator_would_catch_a_broken_config():
    broken = load("cloud")
    broken["available_node_types"]["drafter_gpu"]["min_workers"] = "two"
    with pytest.raises(Exception, match="min_workers|'two'"):
        validated(broken)


def test_the_cloud_config_has_a_cpu_head_and_gpu_worker_types_for_the_target_and_the_drafters():
    config = validated(load("cloud"))
    types = config["available_node_types"]
    assert config["head_node_type"] == "head" and types["head"]["resources"].get("GPU", 0) == 0
    assert types["target_gpu"]["resources"] == {"GPU": 1, "specfleet_target": 1}
    assert types["drafter_gpu"]["resources"] == {"GPU": 1, "specfleet_drafter": 1}
    assert types["drafter_gpu"]["max_workers"] > types["drafter_gpu"]["min_workers"] >= 1


@pytest.mark.parametrize("name", CONFIGS)
def test_every_node_installs_the_pinned_project_and_runs_ray_with_token_authentication(name):
    config = load(name)
    assert config["file_mounts"]["~/.ray/auth_token"] == "~/.ray/auth_token"  # the tokens: files, not in the YAML
    assert not any(".specfleet" in f"{remote} {local}" for remote, local in config["file_mounts"].items()), \
        "specfleet's secrets go to the head alone (ray rsync-up), never to every node"
    setup = " ".join(config["setup_commands"])
    assert "make install" in setup and "RAY_AUTH_MODE=token" in setup
    assert any("ray start --head" in c and "--autoscaling-config" in c for c in config["head_start_ray_commands"])


def test_the_loopback_variant_takes_the_same_steps_as_the_cloud_config_on_127_0_0_1():
    cloud, loopback = load("cloud"), load("loopback")
    assert loopback["provider"] == {"type": "local", "head_ip": "127.0.0.1", "worker_ips": []}
    assert loopback["file_mounts"] == cloud["file_mounts"]
    assert loopback["setup_commands"] == cloud["setup_commands"][1:]  # less the cloud image's apt packages
