"""Dockerfile.server and Dockerfile.operator, read the way docker reads them.

Nothing here builds an image (the e2e suite does, with podman: tests/e2e/images/build.sh).
What is checked: a pinned base (exact Python version and a digest), a build stage that makes
the stubs and the wheels and a final stage that only installs wheels (no build tools), a
numeric non-root USER, fuse3 in the server image, a CMD the CLI accepts, the ports the servers use, and a build context (.dockerignore) that holds what the
build stage copies and nothing of the venv or the tests.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from strata.cacheserver.cli import build_parser
from strata.contract import constants
from strata.operator.cli import build_parser as operator_parser

REPO = Path(__file__).resolve().parents[2]
IMAGES = {"server": REPO / "Dockerfile.server", "operator": REPO / "Dockerfile.operator"}
# Each image runs one command: its ENTRYPOINT, whose parser its CMD must satisfy.
COMMANDS = {"server": "strata", "operator": "strata-operator"}
PARSERS = {"server": build_parser, "operator": operator_parser}
PINNED_BASE = re.compile(r"^python:3\.11\.\d+-slim-bookworm@sha256:[0-9a-f]{64}$")
BUILD_TOOLS = ("grpcio-tools", "gcc", "build-essential", "setuptools", "pip wheel", "gen_protos")


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def values(self, word: str) -> list[str]:
        return [rest for w, rest in self.instructions if w == word]


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, rest) per logical line: continuations joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    result = []
    for line in lines:
        word, _, rest = line.partition(" ")
        result.append((word.upper(), rest.strip()))
    return result


def stages(text: str) -> list[Stage]:
    """The stages of a Dockerfile, with global ARG defaults substituted into FROM."""
    args: dict[str, str] = {}
    found: list[Stage] = []
    for word, rest in instructions(text):
        if word == "ARG" and not found:
            key, _, default = rest.partition("=")
            args[key] = default
        elif word == "FROM":
            parts = rest.split()
            base = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args.get(m.group(1) or m.group(2), ""), parts[0])
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else ""
            found.append(Stage(base, name))
        elif found:
            found[-1].instructions.append((word, rest))
    return found


@pytest.fixture(params=sorted(IMAGES), scope="module")
def image(request: pytest.FixtureRequest) -> tuple[str, list[Stage], str]:
    text = IMAGES[request.param].read_text()
    return request.param, stages(text), text


def test_base_is_pinned_and_shared(image: tuple[str, list[Stage], str]) -> None:
    kind, found, _ = image
    assert len(found) >= 2, f"{kind}: not a multi-stage build"
    for stage in found:
        assert PINNED_BASE.match(stage.base), f"{kind}: base {stage.base!r} is not python:3.11.X-slim-bookworm@sha256:..."
    assert len({s.base for s in found}) == 1, f"{kind}: stages on different bases"


def test_both_images_use_the_same_base() -> None:
    bases = {kind: stages(path.read_text())[-1].base for kind, path in IMAGES.items()}
    assert len(set(bases.values())) == 1, bases


def test_build_stage_makes_stubs_and_wheels(image: tuple[str, list[Stage], str]) -> None:
    kind, found, _ = image
    build = found[0]
    assert build.name == "build"
    runs = " ".join(build.values("RUN"))
    assert "grpcio-tools" in runs and "scripts/gen_protos.sh" in runs and "pip wheel" in runs
    # The stubs must not be newer than the grpcio/protobuf the wheels pin.
    assert "--constraint" in runs and "grpcio|protobuf" in runs
    copied = [shlex.split(c)[:-1] for c in build.values("COPY")]
    sources = {s for c in copied for s in c if not s.startswith("--")}
    assert {"pyproject.toml", "setup.py", "README.md", "contract/", "cacheserver/", "operator/", "scripts/gen_protos.sh"} <= sources


def test_final_stage_installs_wheels_only(image: tuple[str, list[Stage], str]) -> None:
    kind, found, _ = image
    final = found[-1]
    runs = final.values("RUN")
    install = [r for r in runs if "pip install" in r]
    assert len(install) == 1, f"{kind}: one pip install of the built wheels expected"
    assert "--no-index" in install[0] and "from=build" in install[0] and "/wheels" in install[0]
    assert not final.values("COPY") and not final.values("ADD"), f"{kind}: the final stage copies files in"
    for run in runs:
        cleaned = run.replace("pip uninstall -y setuptools wheel", "")
        for tool in BUILD_TOOLS:
            assert tool not in cleaned, f"{kind}: final stage runs {tool!r}"
    assert "pip uninstall -y setuptools wheel" in " ".join(runs)


def test_final_stage_runs_strata_as_non_root(image: tuple[str, list[Stage], str]) -> None:
    kind, found, _ = image
    final = found[-1]
    users = final.values("USER")
    assert users, f"{kind}: no USER"
    uid, _, gid = users[-1].partition(":")
    assert uid.isdigit() and int(uid) != 0, f"{kind}: USER must be a numeric non-root id (runAsNonRoot checks numbers)"
    assert not gid or (gid.isdigit() and int(gid) != 0)
    assert "useradd" in " ".join(final.values("RUN")) and f"--uid {uid}" in " ".join(final.values("RUN"))
    entrypoints = final.values("ENTRYPOINT")
    assert entrypoints == [json.dumps([COMMANDS[kind]])], f"{kind}: ENTRYPOINT must be exec form [\"{COMMANDS[kind]}\"] on one line"


def test_cmd_is_a_command_the_cli_accepts(image: tuple[str, list[Stage], str]) -> None:
    kind, found, _ = image
    cmd = json.loads(found[-1].values("CMD")[-1])
    try:
        PARSERS[kind]().parse_args(cmd)
    except SystemExit as exc:  # --help exits 0; a bad command exits 2
        assert exc.code == 0, f"{kind}: CMD {cmd} is not a {COMMANDS[kind]} command"


def test_server_image_has_fuse_and_the_server_ports() -> None:
    final = stages(IMAGES["server"].read_text())[-1]
    runs = " ".join(final.values("RUN"))
    assert re.search(r"apt-get install -y --no-install-recommends fuse3\b", runs)
    assert "rm -rf /var/lib/apt/lists/*" in runs
    # The import check loads the FUSE server and the gRPC stubs at build time.
    assert "strata.cacheserver.fuse.daemon" in runs and "strata.cacheserver.worker.server" in runs
    ports = {int(p) for e in final.values("EXPOSE") for p in e.split()}
    assert ports == {constants.MASTER_RPC_PORT, constants.MASTER_HTTP_PORT, constants.WORKER_RPC_PORT,
                     constants.WORKER_HTTP_PORT, constants.WORKER_DATA_PORT}
    # master and workers write their data under /var/lib/strata as the image's user
    assert "install -d -o 10001 -g 10001" in runs and "/var/lib/strata" in runs


def test_operator_image_has_no_fuse_and_runs_the_operator() -> None:
    final = stages(IMAGES["operator"].read_text())[-1]
    assert "fuse" not in " ".join(final.values("RUN"))
    cmd = json.loads(final.values("CMD")[-1])
    args = operator_parser().parse_args(cmd)
    assert args.command == "run" and args.all_namespaces and args.peering == "strata"


# -- the build context ---------------------------------------------------------------------------

def _dockerignore_patterns() -> list[tuple[bool, str]]:
    patterns = []
    for line in (REPO / ".dockerignore").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        patterns.append((negated, line.lstrip("!").strip("/")))
    return patterns


def _matches(pattern: str, path: str) -> bool:
    """Docker's rule: a pattern matches a path or any of its parent folders; `*` stays
    within one path element, `**` spans any number."""
    regex = ""
    for part in re.split(r"(\*\*/?|\*|\?)", pattern):
        if part in ("**", "**/"):
            regex += "(.*/)?" if part == "**/" else ".*"
        elif part == "*":
            regex += "[^/]*"
        elif part == "?":
            regex += "[^/]"
        else:
            regex += re.escape(part)
    parts = path.split("/")
    return any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1))


def in_context(path: str) -> bool:
    """Whether `path` (relative to the repo) is sent to the Docker build."""
    included = True
    for negated, pattern in _dockerignore_patterns():
        if _matches(pattern, path):
            included = negated
    return included


def test_build_context_holds_what_the_build_copies() -> None:
    for kind, path in IMAGES.items():
        for stage in stages(path.read_text()):
            for copy in stage.values("COPY"):
                words = [w for w in shlex.split(copy) if not w.startswith("--")]
                for source in words[:-1]:
                    assert (REPO / source).exists(), f"{kind}: COPY {source}: no such file"
                    assert in_context(source.rstrip("/") + ("/__init__.py" if source.endswith("/") else "")), \
                        f"{kind}: COPY {source} is excluded by .dockerignore"
    assert in_context("contract/proto/strata.proto") and in_context("operator/handlers/__init__.py")
    assert in_context("README.md")


def test_every_file_of_the_build_context_is_in_the_image_cache_key() -> None:
    # tests/e2e/images/build.sh names an image's archive by a hash of the files it finds;
    # a context file outside them would let a change reach the tests in an old image.
    script = (REPO / "tests" / "e2e" / "images" / "build.sh").read_text()
    found = re.search(r'context_key="\$\(cd "\$repo" && find (.*?) -type f', script.replace("\\\n", " "), re.S)
    assert found, "build.sh: the find of the build context's files is not where this test looks"
    roots = found.group(1).split()
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    missed = [path for path in tracked if in_context(path)
              and not any(path == root or path.startswith(root + "/") for root in roots)]
    assert not missed, f"in the build context but not in build.sh's cache key: {missed[:5]}"
    assert "contract" in roots


@pytest.mark.parametrize("path", [
    ".venv/bin/python", ".git/HEAD", "tests/unit/test_docs.py", "bench/run.py", "charts/strata/Chart.yaml",
    "contract/proto/strata_pb2.py", "contract/proto/strata_pb2_grpc.pyi", "cacheserver/__pycache__/cli.cpython-311.pyc",
    "operator/builders/__pycache__/x.pyc",
])
def test_build_context_leaves_out(path: str) -> None:
    assert not in_context(path)


def test_dockerignore_matcher_follows_docker_rules() -> None:
    assert _matches("*", "a/b/c") and not _matches("a/*.py", "b/x.py")
    assert _matches("**/__pycache__", "x/y/__pycache__/z.pyc") and _matches("cacheserver", "cacheserver/cli.py")
    assert _matches("cacheserver/proto/*_pb2*.py", "cacheserver/proto/strata_pb2_grpc.py")
    assert not _matches("cacheserver/proto/*_pb2*.py", "cacheserver/proto/sub/strata_pb2.py")
