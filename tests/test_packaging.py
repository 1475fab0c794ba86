"""Packaging: a non-editable install of the project works on its own, the dependencies are
declared as the code imports them, and constraints.txt pins one tested set inside pyproject.toml's
ranges, the one this venv has.

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
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

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
from actors.specialists import shipped_specialists
shipped = shipped_specialists("smollm2-135m")

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
    "recycling_prior": __import__("actors.recycling_table", fromlist=["is_prior_dir"]).is_prior_dir(
        __import__("actors.recycling_table", fromlist=["shipped_prior"]).shipped_prior("smollm2-135m")),
    "specialists": sorted(str(f.relative_to(shipped)) for f in shipped.rglob("*") if f.is_file()),
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
    assert found["recycling_prior"]  # the shipped recycling prior (table and manifest) is in the wheel
    shipped = __import__("actors.specialists", fromlist=["shipped_specialists"]).shipped_specialists("smollm2-135m")
    assert found["specialists"] == sorted(str(f.relative_to(shipped)) for f in shipped.rglob("*") if f.is_file())
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


# constraints.txt: the tested versions, inside pyproject.toml's ranges

def _pins() -> dict[str, Version]:
    """constraints.txt -> {distribution: the version it pins}."""
    pins: dict[str, Version] = {}
    for number, line in enumerate((REPO / "constraints.txt").read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier or [None]
        assert specifier is not None and specifier.operator == "==" and not requirement.extras and not requirement.marker, \
            f"constraints.txt:{number}: {line!r} is not a plain `name==version` pin"
        dist = canonicalize_name(requirement.name)
        assert dist not in pins, f"constraints.txt:{number}: {dist} pinned twice"
        pins[dist] = Version(specifier.version)
    return pins


def _declared() -> dict[str, list[Requirement]]:
    """-> {where: requirements}: the dependencies, each extra and the build requirements (not the
    extras' references to specfleet itself)."""
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    project = pyproject["project"]
    groups = {"dependencies": project["dependencies"], "build-system.requires": pyproject["build-system"]["requires"]}
    groups.update({f"extra {extra}": reqs for extra, reqs in project["optional-dependencies"].items()})
    return {where: [r for r in map(Requirement, reqs) if canonicalize_name(r.name) != "specfleet"]
            for where, reqs in groups.items()}


def _range(requirements: list[Requirement], dist: str) -> SpecifierSet:
    (requirement,) = [r for r in requirements if canonicalize_name(r.name) == dist]
    return requirement.specifier


def test_constraints_txt_pins_every_dependency_extra_and_build_requirement():
    pins = _pins()
    for where, requirements in _declared().items():
        missing = sorted(r.name for r in requirements if canonicalize_name(r.name) not in pins)
        assert not missing, f"{where} in pyproject.toml, not pinned in constraints.txt: {missing}"


def test_each_pinned_version_lies_in_its_pyproject_range():
    pins = _pins()
    for where, requirements in _declared().items():
        for requirement in requirements:
            pinned = pins.get(canonicalize_name(requirement.name))
            assert pinned is None or requirement.specifier.contains(pinned, prereleases=True), \
                f"constraints.txt pins {requirement.name}=={pinned}, outside the range in {where}: {requirement}"


def test_every_requirement_is_a_bounded_range_but_the_builds_exact_grpcio_tools():
    for where, requirements in _declared().items():
        for requirement in requirements:
            operators = {s.operator for s in requirement.specifier}
            if operators == {"=="}:  # an exact pin: only grpcio-tools as a build requirement (below)
                assert (where, canonicalize_name(requirement.name)) == ("build-system.requires", "grpcio-tools"), requirement
                continue
            assert {">=", "<"} <= operators, f"{where}: {requirement} is not a range `>=tested,<next`"


def test_the_pins_cover_and_satisfy_everything_the_dependencies_pull_in():
    """From pyproject.toml's requirements down through the installed distributions' own: each one
    is pinned, at a version that every requirement on it accepts."""
    pins, unpinned, refused = _pins(), set(), []
    todo = [("pyproject.toml", r) for requirements in _declared().values() for r in requirements]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        needed_by, requirement = todo.pop()
        dist = canonicalize_name(requirement.name)
        if dist not in pins:
            unpinned.add(f"{dist} (for {needed_by})")
            continue
        if not requirement.specifier.contains(pins[dist], prereleases=True):
            refused.append(f"{needed_by} needs {requirement}, constraints.txt pins {pins[dist]}")
        if (dist, frozenset(requirement.extras)) in seen:
            continue
        seen.add((dist, frozenset(requirement.extras)))
        for line in importlib.metadata.requires(dist) or []:
            sub = Requirement(line)
            if not sub.marker or any(sub.marker.evaluate({"extra": e}) for e in requirement.extras or {""}):
                todo.append((dist, sub))
    assert not unpinned, f"pulled in, not pinned in constraints.txt: {sorted(unpinned)}"
    assert not refused, refused


def test_this_venv_has_the_pinned_versions_of_the_direct_dependencies():
    pins, differ = _pins(), []
    for requirements in _declared().values():
        for requirement in requirements:
            dist = canonicalize_name(requirement.name)
            if dist not in pins:  # the test above says which
                continue
            installed = importlib.metadata.version(dist)
            # `==2.13.0` accepts torch's 2.13.0+cpu, as pip's -c does
            if not SpecifierSet(f"=={pins[dist]}").contains(installed, prereleases=True):
                differ.append(f"{dist} {installed} installed, constraints.txt pins {pins[dist]}")
    assert not differ, f"{differ}: run `make install`"


def test_the_build_makes_stubs_that_the_grpcio_and_protobuf_ranges_accept():
    """Generated stubs refuse a grpcio older than the grpcio-tools that generated them, and a protobuf
    runtime of another major or older than their gencode (grpcio-tools' own protobuf range)."""
    declared = _declared()
    (tools,) = _range(declared["build-system.requires"], "grpcio-tools")
    grpcio = _range(declared["dependencies"], "grpcio")
    assert tools.operator == "==" and f">={tools.version}" in {str(s) for s in grpcio}, (tools, grpcio)
    assert _pins()["grpcio-tools"] == Version(tools.version), "the venv's grpcio-tools is the build's"
    assert _range(declared["extra build"], "grpcio-tools").contains(tools.version)

    # grpcio-tools' own protobuf range, read from this venv's grpcio-tools: the build's version, as
    # constraints.txt pins it and the venv is checked against it
    gencode = next(Requirement(r).specifier for r in importlib.metadata.requires("grpcio-tools")
                   if canonicalize_name(Requirement(r).name) == "protobuf")
    protobuf = _range(declared["dependencies"], "protobuf")
    lowest = Version(next(s.version for s in protobuf if s.operator == ">="))
    below = Version(next(s.version for s in protobuf if s.operator == "<"))
    assert gencode.contains(lowest), f"protobuf {protobuf}: its lowest version is outside grpcio-tools' {gencode}"
    assert all(s.operator != "<" or Version(s.version) >= below for s in gencode), \
        f"protobuf {protobuf} reaches beyond grpcio-tools' {gencode}"


def test_make_install_installs_with_the_constraints():
    makefile = (REPO / "Makefile").read_text()
    rule = makefile.split("\n$(STAMP):", 1)[1].split("\n\n", 1)[0]
    assert "constraints.txt" in rule.splitlines()[0].split(), "the install stamp must depend on constraints.txt"
    installs = [line.strip() for line in rule.splitlines() if "$(PIP) install" in line and "--upgrade pip" not in line]
    assert installs and installs[0].endswith(" torch"), installs  # torch first (the CPU build)
    unconstrained = [line for line in installs if "-c constraints.txt" not in line and "--no-deps" not in line]
    assert not unconstrained, unconstrained
