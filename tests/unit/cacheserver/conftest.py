"""Shared fixtures of the cache server's unit tests: a real S3 endpoint (moto) on loopback."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import s3server


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
