"""Shared fixtures of the cache server's unit tests: a real S3 endpoint (moto) on loopback."""

from __future__ import annotations

import importlib.util
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

_SUPPORT = Path(__file__).resolve().parents[2] / "support"


def load_support(name: str) -> ModuleType:
    """Import tests/support/<name>.py by path (the repo root must stay off sys.path: its
    folder operator/ would shadow the standard library)."""
    module_name = f"strata_test_support_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, _SUPPORT / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


s3server = load_support("s3server")


@pytest.fixture(scope="session")
def s3_server() -> Iterator[s3server.S3Server]:
    """moto's S3 that accepts any credentials."""
    server = s3server.start_moto_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3_auth_server() -> Iterator[s3server.S3Server]:
    """moto's S3 that checks credentials and permissions like AWS does."""
    server = s3server.start_moto_server(enforce_auth=True)
    yield server
    server.stop()


@pytest.fixture
def bucket(s3_server: s3server.S3Server) -> str:
    """A new, empty bucket on `s3_server`."""
    name = f"strata-{uuid.uuid4().hex[:12]}"
    s3_server.create_bucket(name)
    return name
