"""Build hook (metadata is in pyproject.toml): generate the gRPC stubs at build time.

deploy/service/proto/specfleet_pb2.py and specfleet_pb2_grpc.py are gitignored; they are
generated from specfleet.proto with grpc_tools.protoc (a build requirement, pinned in
pyproject.toml) and `-I <project root>`, so that they import each other as deploy.service.proto.*
(the name Serve's gRPC proxy imports). A wheel or a non-editable `pip install .` gets them in the
build directory; an editable install (`make install`) gets them beside the .proto in the source tree.
"""
from __future__ import annotations

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
PROTO = Path("deploy", "service", "proto", "specfleet.proto")


def generate_grpc_stubs(out_dir: Path) -> None:
    import importlib.resources

    from grpc_tools import protoc

    well_known = importlib.resources.files("grpc_tools") / "_proto"  # google/protobuf/*.proto
    out_dir.mkdir(parents=True, exist_ok=True)
    args = ["grpc_tools.protoc", f"-I{ROOT}", f"-I{well_known}", f"--python_out={out_dir}",
            f"--grpc_python_out={out_dir}", str(ROOT / PROTO)]
    if protoc.main(args) != 0:
        raise RuntimeError(f"grpc_tools.protoc failed on {PROTO}")


class BuildPyWithGrpcStubs(build_py):
    def run(self) -> None:
        super().run()
        generate_grpc_stubs(ROOT if self.editable_mode else Path(self.build_lib))

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        outputs = super().get_outputs(include_bytecode)
        if not self.editable_mode:
            stubs = PROTO.parent
            outputs += [str(Path(self.build_lib, stubs, f"specfleet_{kind}.py")) for kind in ("pb2", "pb2_grpc")]
        return list(dict.fromkeys(outputs))


setup(cmdclass={"build_py": BuildPyWithGrpcStubs})
