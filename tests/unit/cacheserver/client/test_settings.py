from __future__ import annotations

import pytest

from strata.cacheserver.client.settings import ClientSettings
from strata.contract.errors import InvalidArgument


def test_defaults() -> None:
    assert ClientSettings().model_dump() == {
        "master_timeout": 30.0, "block_timeout": 45.0, "connect_timeout": 3.0, "stall_check_after": 2.0,
        "liveness_timeout": 1.0, "skip_stalled_for": 10.0, "master_quick_timeout": 2.0,
        "master_outage_grace": 120.0, "no_workers_wait": 10.0, "held_statuses": None, "held_blocks": 256,
        "held_blocks_for": 10.0,
        "near_cache": "", "near_cache_bytes": 4 << 30,
    }


def test_the_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_CLIENT_BLOCK_TIMEOUT", "90")
    monkeypatch.setenv("STRATA_CLIENT_MASTER_OUTAGE_GRACE", "0")
    settings = ClientSettings()
    assert (settings.block_timeout, settings.master_outage_grace, settings.master_timeout) == (90.0, 0.0, 30.0)


def test_a_bad_value_names_the_variable_and_the_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_CLIENT_MASTER_TIMEOUT", "30s")
    with pytest.raises(InvalidArgument,
                       match="^STRATA_CLIENT_MASTER_TIMEOUT='30s' is not valid: Input should be a valid number"):
        ClientSettings()
    monkeypatch.setenv("STRATA_CLIENT_MASTER_TIMEOUT", "0")
    with pytest.raises(InvalidArgument, match="^STRATA_CLIENT_MASTER_TIMEOUT='0' is not valid: Input should be greater than 0"):
        ClientSettings()
