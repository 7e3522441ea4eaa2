"""Which pods run as local processes, and with what command.

A container whose image repository ends in `strata-server` or
`strata-operator` is one of the project's own images; the agent runs it as a
local process. Its ENTRYPOINT/CMD come from Dockerfile.server /
Dockerfile.operator at the repo root, exactly as a container runtime would
combine them with the pod's `command`/`args`. While those files do not exist
yet, the entrypoint falls back to ["strata"] (the console script the image
will install) with no CMD.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOCKERFILES = {"strata-server": REPO / "Dockerfile.server", "strata-operator": REPO / "Dockerfile.operator"}
FALLBACK_ENTRYPOINT = ("strata",)


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    workdir: str  # the container's default working directory
    source: str  # the Dockerfile, or a note that the fallback is used


def repository(image: str) -> str:
    """The image reference without registry-port confusion, tag or digest."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    return name


def project_image(image: str) -> str | None:
    """'strata-server' or 'strata-operator' when the image is one of ours."""
    repo = repository(image)
    for suffix in DOCKERFILES:
        if repo == suffix or repo.endswith("/" + suffix):
            return suffix
    return None


def _instruction_value(text: str) -> tuple[str, ...]:
    text = text.strip()
    if text.startswith("["):
        return tuple(str(x) for x in json.loads(text))
    return ("/bin/sh", "-c", text)


def _logical_lines(text: str) -> list[str]:
    joined = re.sub(r"\\\n", " ", text)
    return [ln.strip() for ln in joined.splitlines() if ln.strip() and not ln.strip().startswith("#")]


def parse_dockerfile(path: Path) -> ImageConfig:
    """ENTRYPOINT, CMD and STRATA_* ENV of the final stage of a Dockerfile."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: dict[str, str] = {}
    workdir = "/"
    for line in _logical_lines(path.read_text()):
        word, _, rest = line.partition(" ")
        word = word.upper()
        if word == "FROM":
            entrypoint, cmd, env, workdir = (), (), {}, "/"
        elif word == "WORKDIR":
            workdir = os.path.normpath(os.path.join(workdir, rest.strip()))
        elif word == "ENTRYPOINT":
            entrypoint, cmd = _instruction_value(rest), ()  # ENTRYPOINT resets an inherited CMD
        elif word == "CMD":
            cmd = _instruction_value(rest)
        elif word == "ENV":
            parts = shlex.split(rest)
            if len(parts) == 2 and "=" not in parts[0]:
                parts = [f"{parts[0]}={parts[1]}"]
            for part in parts:
                key, sep, value = part.partition("=")
                # Only the app's own settings: PATH and friends point into the
                # image's filesystem, which a local process does not have.
                if sep and key.startswith("STRATA_"):
                    env[key] = value
    return ImageConfig(entrypoint, cmd, tuple(env.items()), workdir, str(path))


def image_config(kind: str) -> ImageConfig:
    path = DOCKERFILES[kind]
    if path.is_file():
        return parse_dockerfile(path)
    return ImageConfig(FALLBACK_ENTRYPOINT, (), (), "/", f"{path.name} missing: fallback entrypoint strata")


def container_argv(image: ImageConfig, command: list[str] | None, args: list[str] | None) -> list[str]:
    """Combine image and container the way a runtime does."""
    if command:
        return list(command) + list(args or [])
    return list(image.entrypoint) + (list(args) if args else list(image.cmd))
