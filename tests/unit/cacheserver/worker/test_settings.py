from __future__ import annotations

import pytest

from strata.cacheserver.worker.settings import (
    MASTER_WAIT_SETTING,
    PEER_WAIT_SETTING,
    HandoffSettings,
    MasterLinkSettings,
    PeerSettings,
    UploadSettings,
)
from strata.contract.errors import InvalidArgument


def test_defaults() -> None:
    assert PeerSettings().peer_wait == 2.0
    assert MasterLinkSettings().master_wait == 15.0
    uploads = UploadSettings()
    assert (uploads.base_delay, uploads.max_delay, uploads.attempt_timeout, uploads.min_bytes_per_second,
            uploads.drain_timeout) == (0.5, 5.0, 60.0, 1 << 20, 20.0)
    assert uploads.timeout_for(4 << 20) == 64.0
    assert (HandoffSettings().seconds, HandoffSettings().bytes_per_second) == (20.0, 256 << 20)
    assert HandoffSettings().notice_seconds == 3.0


def test_the_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PEER_WAIT_SETTING, "0.5")
    monkeypatch.setenv(MASTER_WAIT_SETTING, "0")
    monkeypatch.setenv("STRATA_UPLOAD_DRAIN_TIMEOUT", "5")
    monkeypatch.setenv("STRATA_UPLOAD_MIN_BYTES_PER_SECOND", "1024")
    monkeypatch.setenv("STRATA_WORKER_HANDOFF_SECONDS", "0")
    monkeypatch.setenv("STRATA_WORKER_HANDOFF_NOTICE_SECONDS", "0.5")
    assert PeerSettings().peer_wait == 0.5
    assert MasterLinkSettings().master_wait == 0.0
    uploads = UploadSettings()
    assert (uploads.drain_timeout, uploads.min_bytes_per_second) == (5.0, 1024)
    assert HandoffSettings().seconds == 0.0
    assert HandoffSettings().notice_seconds == 0.5


@pytest.mark.parametrize("model,name,value,message", [
    (PeerSettings, "STRATA_WORKER_PEER_WAIT", "0", "Input should be greater than 0"),
    (MasterLinkSettings, "STRATA_WORKER_MASTER_WAIT", "-1", "Input should be greater than or equal to 0"),
    (UploadSettings, "STRATA_UPLOAD_MAX_DELAY", "5s", "Input should be a valid number"),
    (UploadSettings, "STRATA_UPLOAD_MIN_BYTES_PER_SECOND", "1Mi", "Input should be a valid integer"),
    (HandoffSettings, "STRATA_WORKER_HANDOFF_BYTES_PER_SECOND", "0", "Input should be greater than 0"),
])
def test_a_bad_value_names_the_variable_and_the_value(monkeypatch: pytest.MonkeyPatch, model: type[PeerSettings],
                                                      name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgument, match=f"^{name}='{value}' is not valid: {message}"):
        model()
