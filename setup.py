"""Map the source folders to their import names: contract/ -> strata.contract,
operator/ -> strata.operator, cacheserver/ -> strata.cacheserver; make the gRPC stubs from the .proto files in every
build (wheel, sdist, editable), so an installed package never lacks them; and build the
compiled core (native/, with cargo). Everything else is in pyproject.toml.

`python -P setup.py build_protos` makes the stubs in the source tree (scripts/gen_protos.sh
runs it; with mypy-protobuf installed the type stubs are mypy-protobuf's)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

from setuptools import Command, find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustExtension

FOLDERS = {"strata.contract": "contract", "strata.operator": "operator", "strata.cacheserver": "cacheserver"}
# Folders holding .proto files, and the package their stubs are imported from.
PROTO_PACKAGES = {"contract/proto": "strata.contract.proto", "cacheserver/csi/proto": "strata.cacheserver.csi.proto"}
HERE = Path(__file__).resolve().parent


def mapped_packages() -> list[str]:
    packages = []
    for name, folder in FOLDERS.items():
        packages.append(name)
        packages.extend(f"{name}.{sub}" for sub in find_packages(folder))
    return packages


def _type_stub_args(out: Path) -> list[str]:
    """mypy-protobuf's typed stubs when its plugins are installed, else protoc's own."""
    bin_dir = Path(sys.executable).parent
    mypy, mypy_grpc = bin_dir / "protoc-gen-mypy", bin_dir / "protoc-gen-mypy_grpc"
    # (an isolated build env may see the plugins' scripts but not their module)
    if mypy.exists() and mypy_grpc.exists() and importlib.util.find_spec("mypy_protobuf") is not None:
        return [f"--plugin=protoc-gen-mypy={mypy}", f"--mypy_out={out}",
                f"--plugin=protoc-gen-mypy_grpc={mypy_grpc}", f"--mypy_grpc_out={out}"]
    return [f"--pyi_out={out}"]


def _stubs_of(proto: Path) -> list[Path]:
    stem = proto.with_suffix("")
    return [Path(f"{stem}{suffix}") for suffix in ("_pb2.py", "_pb2_grpc.py", "_pb2.pyi")]


def generate_stubs(*, force: bool = False) -> None:
    """<name>_pb2.py, <name>_pb2_grpc.py and their .pyi next to each .proto, with the
    generated imports made package imports (protoc writes `import x_pb2`). Without `force`,
    stubs newer than their .proto are kept (a build leaves a developer's typed stubs alone)."""
    from grpc_tools import protoc  # a build requirement (pyproject.toml)

    well_known = Path(protoc.__file__).parent / "_proto"
    for folder, package in PROTO_PACKAGES.items():
        out = HERE / folder
        for proto in sorted(out.glob("*.proto")):
            stubs = _stubs_of(proto)
            if not force and all(s.exists() and s.stat().st_mtime >= proto.stat().st_mtime for s in stubs):
                continue
            args = ["protoc", f"-I{out}", f"-I{well_known}", f"--python_out={out}", f"--grpc_python_out={out}",
                    *_type_stub_args(out), str(proto)]
            if protoc.main(args) != 0:
                raise SystemExit(f"protoc failed on {proto}")
            grpc_stub = stubs[1]
            text = grpc_stub.read_text()
            grpc_stub.write_text(re.sub(r"^import ([a-z_]+_pb2) as ", rf"from {package} import \1 as ", text, flags=re.M))


class build_protos(Command):  # noqa: N801 - setuptools names commands by their class
    description = "make the gRPC stubs from the .proto files (in the source tree)"
    user_options: list[tuple[str, str | None, str]] = []

    def initialize_options(self) -> None:
        pass

    def finalize_options(self) -> None:
        pass

    def run(self) -> None:
        generate_stubs(force=True)


class build_py_with_protos(build_py):
    def run(self) -> None:
        generate_stubs()
        super().run()


class sdist_with_protos(sdist):
    def run(self) -> None:
        generate_stubs()
        super().run()


setup(
    packages=mapped_packages(),
    package_dir=FOLDERS,
    # The compiled core (native/, Rust): strata.cacheserver.native, one module for every
    # Python 3.11+ (the stable ABI), built by cargo in every build.
    rust_extensions=[RustExtension("strata.cacheserver.native", "native/Cargo.toml", binding=Binding.PyO3,
                                   py_limited_api=True, debug=False)],
    options={"bdist_wheel": {"py_limited_api": "cp311"}},
    cmdclass={"build_protos": build_protos, "build_py": build_py_with_protos, "sdist": sdist_with_protos},
)
