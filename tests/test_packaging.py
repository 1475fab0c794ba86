"""Packaging: a non-editable install of the project works on its own, and the dependencies are
declared as the code imports them.

The install test builds the wheel from a copy of the source tree (without the generated gRPC
stubs, which the build must generate) as `pip install .` does, with the dev venv's setuptools and
grpcio-tools (the `build` extra; no build isolation, no index), installs it into a fresh venv and
runs it from a directory outside the repository. The fresh venv finds the third-party packages in
the dev venv's site-packages through a plain path line in a .pth file: the dev venv's own .pth
files (among them the editable install's finder) are not processed, so specfleet can only come
from the fresh venv, which the checks assert.
"""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("actors", "policy", "cluster", "deploy")
# declared although no module imports them, and why
NOT_IMPORTED = {
    "gguf": "transformers reads the embedded GGUF model (`gguf_file=`) with it",
    "accelerate": "transformers refuses `gguf_file=` without it",
    "protobuf": "the generated gRPC stubs import google.protobuf",
}
BENCH_ONLY = {"matplotlib": "deploy/bench/charts.py"}  # extra `bench`, imported lazily by `specfleet bench --out`
COPY_IGNORE = shutil.ignore_patterns(".venv", ".git", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                     "bench-out", "*_pb2.py", "*_pb2_grpc.py")


def _run(args: list, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env["HF_HUB_OFFLINE"] = "1"  # the embedded model is local; nothing may come from a hub
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{args} failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """-> (the fresh venv's python, its site-packages, a work directory outside the repository)."""
    root = tmp_path_factory.mktemp("packaging")
    src, wheels, venv, work = root / "src", root / "wheels", root / "venv", root / "work"
    shutil.copytree(REPO, src, ignore=COPY_IGNORE, symlinks=True)
    work.mkdir()
    assert not list((src / "deploy" / "service" / "proto").glob("*_pb2*.py"))
    _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
          "-w", wheels, src], cwd=work)
    (wheel,) = wheels.glob("specfleet-*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=work)
    python = venv / "bin" / "python"
    _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps", "--no-index", wheel], cwd=work)
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], cwd=work).stdout.strip())
    dev_site = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "zz_specfleet_dev_deps.pth").write_text("".join(f"{p}\n" for p in sorted(dev_site)))
    return python, site, work


CHECK = r"""
import importlib, importlib.metadata, json, sys
from pathlib import Path
import deploy, deploy.cli
import deploy.service.proto.specfleet_pb2 as pb2
import deploy.service.proto.specfleet_pb2_grpc as pb2_grpc
import deploy.service.app as app
import deploy.specialists.build as specialists
from deploy.bench.prompts import PROMPTS_DIR
from deploy.config import ServiceConfig

module, _, attr = app.GRPC_SERVICER.rpartition(".")
servicer = getattr(importlib.import_module(module), attr)
config = Path(deploy.__file__).parent / "serve_config.yaml"
args, _ = app.load_serve_config(config)
ServiceConfig(**args)
document_import = __import__("yaml").safe_load(config.read_text())["applications"][0]["import_path"]
module, _, attr = document_import.partition(":")
getattr(importlib.import_module(module), attr)
print(json.dumps({
    "modules": {name: m.__file__ for name, m in sys.modules.items()
                if name.split(".")[0] in ("actors", "policy", "cluster", "deploy") and getattr(m, "__file__", None)},
    "meta_path": [repr(f) for f in sys.meta_path],
    "dist": str(importlib.metadata.distribution("specfleet").locate_file("")),
    "prompts": sorted(str(p.relative_to(PROMPTS_DIR)) for p in PROMPTS_DIR.rglob("*.jsonl")),
    "train": sorted(p.name for p in specialists.TRAIN_PROMPTS.glob("*.jsonl")),
    "proto": (Path(pb2.__file__).parent / "specfleet.proto").is_file(),
    "servicer": servicer.__name__, "stub": pb2_grpc.SpecfleetStub.__name__,
    "request": pb2.GenerateRequest(prompt="x").prompt,
}))
"""


def test_non_editable_install_has_the_code_the_data_and_the_grpc_stubs(installed):
    python, site, work = installed
    help_text = _run([python.parent / "specfleet", "--help"], cwd=work).stdout
    for command in ("generate", "serve", "bench", "specialists"):
        assert command in help_text

    found = json.loads(_run([python, "-c", CHECK], cwd=work).stdout.strip().splitlines()[-1])
    assert found["modules"]["deploy"].startswith(str(site)), found["modules"]["deploy"]
    outside = {name: f for name, f in found["modules"].items() if not f.startswith(str(site))}
    assert not outside, f"specfleet modules not from the installed copy: {outside}"
    assert not [f for f in found["meta_path"] if "editable" in f.lower()], found["meta_path"]
    assert found["dist"].startswith(str(site)), found["dist"]
    source_prompts = sorted(str(p.relative_to(REPO / "deploy" / "prompts")) for p in (REPO / "deploy" / "prompts").rglob("*.jsonl"))
    assert found["prompts"] == source_prompts and any(p.startswith("train/") for p in source_prompts)
    assert found["train"] == sorted(p.name for p in (REPO / "deploy" / "prompts" / "train").glob("*.jsonl"))
    assert found["proto"]
    assert (found["servicer"], found["stub"], found["request"]) == ("add_SpecfleetServicer_to_server", "SpecfleetStub", "x")


@pytest.mark.model
def test_installed_specfleet_generates_with_the_embedded_model(installed):
    python, _, work = installed
    # --no-spec: plain target decoding; the engine's drafting path would first profile the target's
    # forward sizes (a minute or more on a busy 2-core machine), which other tests cover
    out = _run([python.parent / "specfleet", "generate", "--prompt", "Hi", "--max-tokens", "4", "--no-spec", "--json"],
               cwd=work, timeout=300).stdout
    result = json.loads(out.strip().splitlines()[-1])
    assert result["text"].strip() and len(result["token_ids"]) == 4 and result["finish_reason"] == "length"


def _imports(path: Path) -> list[tuple[str, bool]]:
    """-> (module imported, whether at module level rather than inside a function); for
    `from M import a` both M and M.a (which may be a submodule)."""
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((alias.name, not in_function) for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                found.append((child.module, not in_function))
                found.extend((f"{child.module}.{alias.name}", not in_function) for alias in child.names)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(path.read_text(), str(path)), False)
    return found


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _distribution_of(module: str, owners: dict[str, list[str]]) -> str:
    candidates = sorted({_canonical(d) for d in owners.get(module.split(".")[0], [])})
    if len(candidates) > 1:  # a namespace package (google.*): the one that holds the subpackage
        prefix = "/".join(module.split(".")[:2]) + "/"
        candidates = [d for d in candidates
                      if any(str(f).startswith(prefix) for f in importlib.metadata.distribution(d).files or [])]
    assert len(candidates) == 1, f"cannot tell which distribution provides {module}: {candidates}"
    return candidates[0]


def test_dependencies_are_declared_as_imported():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    name = lambda requirement: _canonical(re.match(r"[A-Za-z0-9._-]+", requirement).group())  # noqa: E731
    declared = {name(r) for r in project["dependencies"]}
    extras = {extra: {name(r) for r in reqs} - {"specfleet"} for extra, reqs in project["optional-dependencies"].items()}

    owners = importlib.metadata.packages_distributions()
    imported: dict[str, set[str]] = {}  # distribution -> the files importing it
    for path in sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py")):
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):  # generated, gitignored: see NOT_IMPORTED
            continue
        rel = str(path.relative_to(REPO))
        for module, at_module_level in _imports(path):
            top = module.split(".")[0]
            if module == "deploy.bench.charts":
                assert not at_module_level, f"{rel} imports deploy.bench.charts at module level (matplotlib is the bench extra)"
            if top in PACKAGES or top in sys.stdlib_module_names:
                continue
            module = ".".join(module.split(".")[:2])  # two levels tell the distribution (google.protobuf)
            if top not in owners:
                raise AssertionError(f"{rel} imports {module}, which no installed distribution provides")
            imported.setdefault(_distribution_of(module, owners), set()).add(rel)

    bench = {dist for dist in imported if dist in BENCH_ONLY}
    for dist in bench:
        assert imported[dist] == {BENCH_ONLY[dist]}, f"{dist} (extra `bench`) imported beyond {BENCH_ONLY[dist]}: {imported[dist]}"
    runtime = set(imported) - bench
    assert runtime <= declared, f"imported, not declared: {sorted(runtime - declared)}"
    assert declared - runtime == set(NOT_IMPORTED), f"declared, never imported: {sorted(declared - runtime - set(NOT_IMPORTED))}"
    assert bench == set(BENCH_ONLY) and set(BENCH_ONLY) <= extras["bench"] and not extras["bench"] & declared
    assert {"grpcio-tools", "setuptools"} <= extras["build"]

    # the reasons in NOT_IMPORTED still hold for the pinned transformers
    transformers_dir = Path(importlib.util.find_spec("transformers").origin).parent
    assert "accelerate is required when loading a GGUF file" in (transformers_dir / "modeling_utils.py").read_text()
    assert "from gguf import" in (transformers_dir / "modeling_gguf_pytorch_utils.py").read_text()
    # the build requirements pin grpcio-tools as grpcio is pinned (the stubs check the grpcio version)
    build_requires = pyproject["build-system"]["requires"]
    grpcio = next(r for r in project["dependencies"] if name(r) == "grpcio").split("==")[1]
    assert f"grpcio-tools=={grpcio}" in build_requires
