"""The math, drafters, policies and engine import and run with `ray` unavailable."""
import subprocess
import sys

CORE_MODULES = [
    "actors.proposal", "actors.session", "actors.kv_cache", "actors.ngram", "actors.suffix", "actors.hf", "actors.hierarchy",
    "actors.no_draft", "actors.models", "actors.pool", "actors.retrieval", "actors.distilled", "actors.specialists",
    "policy.bandit", "policy.ucb", "policy.sw_ucb", "policy.exp3", "policy.thompson", "policy.sequential_halving",
    "policy.random_arm", "policy.fixed", "policy.reward", "policy.registry", "policy.coordinator",
    "deploy.errors", "deploy.auth", "deploy.generation", "deploy.sampling", "deploy.verify", "deploy.draft_tree",
    "deploy.tree_verify", "deploy.target", "deploy.engine", "deploy.bench", "deploy.cost_profile",
    "deploy.bench.verify_cost", "deploy.cli", "deploy.specialists.tasks", "deploy.specialists.corpus",
    "deploy.specialists.distill", "deploy.specialists.build",
]


def test_every_core_module_imports_with_ray_blocked():
    code = "import sys; sys.modules['ray'] = None\n" + "\n".join(f"import {m}" for m in CORE_MODULES)
    code += "\nassert 'ray' not in [k for k, v in sys.modules.items() if v is not None]"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_core_and_the_http_front_import_without_the_grpc_stubs():
    code = "import sys; sys.modules['ray'] = None; sys.modules['deploy.proto.specfleet_pb2'] = None\n"
    code += "\n".join(f"import {m}" for m in CORE_MODULES + ["deploy.server"])
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_blocking_ray_really_blocks_it():
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['ray'] = None; import ray"],
                          capture_output=True, text=True)
    assert done.returncode != 0
