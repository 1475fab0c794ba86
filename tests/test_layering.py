"""The folders are layers and imports only point down: actors (drafters and the shared vocabulary)
< policy (bandits, rewards, the plain coordinator) < deploy.engine (the speculative core) <
deploy.config < cluster (every Ray wrapper) < deploy.service (Serve app, HTTP, gRPC) < the rest of
deploy (CLI, bench, specialists builder). Checked on the source itself, lazy imports included; the
module import graph has no cycles; the three bottom layers never import Ray, and import and run
with Ray blocked."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("actors", "policy", "cluster", "deploy")
LAYERS = ("actors", "policy", "deploy.engine", "deploy.config", "cluster", "deploy.service", "deploy")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_modules() -> dict[str, Path]:
    """The project's modules (the generated gRPC stubs left out)."""
    return {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")
            if not p.name.endswith(("_pb2.py", "_pb2_grpc.py"))}


def layer(module: str) -> int:
    matches = [i for i, prefix in enumerate(LAYERS) if module == prefix or module.startswith(prefix + ".")]
    return max(matches, key=lambda i: len(LAYERS[i]))


def imports(path: Path) -> set[str]:
    """Every module the file imports (at the top or inside a function), by absolute name."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def project_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """The project's modules a file imports (`from package import module` names the module;
    importing a package's own __init__ for a name in it names the package)."""
    out = set()
    for name in imports(path):
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name and name.split(".")[0] in PACKAGES:
            out.add(name)
    return out


MODULES = source_modules()
GRAPH = {name: project_imports(path, MODULES) - {name} for name, path in MODULES.items()}


def test_the_check_sees_acceptance_import_the_verifier_and_the_cli_import_the_engine():
    assert "deploy.engine.verify" in GRAPH["deploy.engine.acceptance"]
    assert "deploy.engine.engine" in GRAPH["deploy.cli"] or any("deploy.engine" in m for m in GRAPH["deploy.cli"])


@pytest.mark.parametrize("name", sorted(MODULES))
def test_no_module_imports_from_a_layer_above_its_own(name):
    upward = sorted(m for m in GRAPH[name] if layer(m) > layer(name))
    assert not upward, f"{name} (layer {LAYERS[layer(name)]}) imports {upward}"


def test_the_module_import_graph_has_no_cycles():
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for other in sorted(GRAPH.get(name, ())):
            if state.get(other) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(other):] + [other]))
            if other not in state:
                visit(other, path + [other])
        state[name] = 2

    for name in sorted(GRAPH):
        if name not in state:
            visit(name, [name])


@pytest.mark.parametrize("name", sorted(m for m in MODULES if layer(m) < LAYERS.index("deploy.config")))
def test_the_bottom_layers_never_import_ray(name):
    assert not {m for m in imports(MODULES[name]) if m == "ray" or m.startswith("ray.")}


def test_the_bottom_layers_the_cli_and_the_bench_import_with_ray_and_the_grpc_stubs_blocked():
    names = sorted(m for m in MODULES if layer(m) < LAYERS.index("deploy.config"))
    names += ["deploy.cli", "deploy.bench", "deploy.specialists.build", "deploy.service.server"]
    code = "import sys; sys.modules['ray'] = None; sys.modules['deploy.service.proto.specfleet_pb2'] = None\n"
    code += "\n".join(f"import {m}" for m in names)
    code += "\nassert 'ray' not in [k for k, v in sys.modules.items() if v is not None]"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr


def test_blocking_ray_really_blocks_it():
    done = subprocess.run([sys.executable, "-c", "import sys; sys.modules['ray'] = None; import ray"],
                          capture_output=True, text=True)
    assert done.returncode != 0


def test_an_upward_import_inside_a_function_is_caught(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from deploy.engine.engine import SpeculativeEngine\n")
    assert any(layer(m) > layer("policy.coordinator") for m in project_imports(bad, MODULES))
