"""The environment of a FUSE mount's processes, read in one place: defaults, values, and the
error a bad value answers (it names the variable and the value)."""

from __future__ import annotations

from pathlib import Path

import pytest

from strata.cacheserver.fuse import settings
from strata.cacheserver.fuse.settings import fuse_environment
from strata.contract.errors import InvalidArgument

VARIABLES = (settings.STATE_DIR_ENV, settings.RUNTIME_DIR_ENV, settings.RESUME_TIMEOUT_ENV, settings.HOLDER_ENV,
             settings.HOLDER_WAIT_ENV)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_unset_or_blank_variables_take_the_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    unset = fuse_environment()
    assert (unset.resume_timeout, unset.holder, unset.holder_wait) == (60.0, None, 30.0)
    for name in VARIABLES:
        monkeypatch.setenv(name, "  ")
    assert fuse_environment() == unset


def test_the_environment_sets_each_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(settings.STATE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(settings.RESUME_TIMEOUT_ENV, "2.5")
    monkeypatch.setenv(settings.HOLDER_ENV, " /run/strata/fuse/holder.sock ")
    monkeypatch.setenv(settings.HOLDER_WAIT_ENV, "7")
    environment = fuse_environment()
    assert environment.state_root() == tmp_path
    assert environment.resume_timeout == 2.5
    assert environment.holder == Path("/run/strata/fuse/holder.sock")
    assert environment.holder_wait == 7.0


@pytest.mark.parametrize("name", [settings.RESUME_TIMEOUT_ENV, settings.HOLDER_WAIT_ENV])
@pytest.mark.parametrize("bad", ["soon", "0", "-1", "nan", "inf", "86400"])
def test_bad_seconds_are_refused_naming_the_variable_and_the_value(
        monkeypatch: pytest.MonkeyPatch, name: str, bad: str) -> None:
    monkeypatch.setenv(name, bad)
    with pytest.raises(InvalidArgument, match=rf"^{name} must be seconds \(0 < s < 86400\), not '{bad}'$"):
        fuse_environment()


def test_every_bad_variable_is_named_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.RESUME_TIMEOUT_ENV, "soon")
    monkeypatch.setenv(settings.HOLDER_WAIT_ENV, "-1")
    with pytest.raises(InvalidArgument) as raised:
        fuse_environment()
    assert settings.RESUME_TIMEOUT_ENV in str(raised.value) and settings.HOLDER_WAIT_ENV in str(raised.value)


def test_the_state_root_without_strata_fuse_state_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Who runs the tests decides which user the process is: os.geteuid stands in for root and
    for another user."""
    monkeypatch.setattr(settings.os, "geteuid", lambda: 0)
    assert fuse_environment().state_root() == Path("/run/strata/fuse")
    monkeypatch.setattr(settings.os, "geteuid", lambda: 1000)
    monkeypatch.setattr(settings.os, "getuid", lambda: 1000)
    assert fuse_environment().state_root() == Path("/tmp/strata-fuse-1000")
    monkeypatch.setenv(settings.RUNTIME_DIR_ENV, str(tmp_path))
    assert fuse_environment().state_root() == tmp_path / "strata" / "fuse"
