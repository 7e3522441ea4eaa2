from __future__ import annotations

from pathlib import Path

import pytest

from strata.cacheserver.settings import RetrySettings, ServerEnvironment, StoreTimeouts, load_server_config
from strata.contract.config import ServerConfig
from strata.contract.errors import InvalidArgument


def test_yaml_round_trip_with_quantities(tmp_path: Path) -> None:
    path = tmp_path / "strata.yaml"
    path.write_text("blockSize: 8Mi\ntiers:\n- {medium: MEM, quota: 1Gi}\n- {medium: SSD, quota: 10Gi, dirs: [/ssd]}\n"
                    "cachePolicy: {eviction: LRFU, readType: CACHE_PROMOTE}\n")
    config = load_server_config(path)
    assert config.block_size == 8 << 20
    assert [(t.medium, t.quota) for t in config.tiers] == [("MEM", 1 << 30), ("SSD", 10 << 30)]
    assert config.cache_policy.eviction == "LRFU"
    again = tmp_path / "again.yaml"
    again.write_text(config.to_yaml())
    assert load_server_config(again) == config


@pytest.mark.parametrize("body,message", [
    ("tiers: [{medium: MEM, quota: 0}]", "quota"),
    ("tiers: [{medium: SSD, quota: 1Gi}, {medium: MEM, quota: 1Gi}]", "fastest first"),
    ("tiers: [{medium: MEM, quota: 1Gi}, {medium: MEM, quota: 1Gi}]", "one tier of each medium"),
    ("tiers: [{medium: TAPE, quota: 1Gi}]", "TAPE"),
    ("cachePolicy: {highWatermark: 0.5, lowWatermark: 0.7}", "lowWatermark"),
    ("blockSize: huge", "blockSize"),
    ("[1, 2]", "mapping"),
    ("tiers: [", "not valid YAML"),
])
def test_bad_config_names_the_problem(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(body)
    with pytest.raises(InvalidArgument, match=message):
        load_server_config(path)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_MASTER", "m:1")
    monkeypatch.setenv("STRATA_BLOCK_SIZE", "1Mi")
    config = load_server_config(None)
    assert (config.master_address, config.block_size) == ("m:1", 1 << 20)
    assert ServerConfig().master_address.endswith(":19998")


def test_local_sources_and_data_port_settings() -> None:
    config = ServerConfig.model_validate({})
    assert config.local_sources.allowed_roots == ()  # no file:// sources unless allowed
    assert (config.data_port.max_connections, config.data_port.idle_timeout) == (256, 60.0)
    with pytest.raises(ValueError, match="'nfs' is not an absolute path"):
        ServerConfig.model_validate({"localSources": {"allowedRoots": ["nfs"]}})
    with pytest.raises(ValueError, match="maxConnections"):
        ServerConfig.model_validate({"dataPort": {"maxConnections": 0}})


def test_the_server_environment_is_one_model_and_empty_variables_count_as_unset(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_MASTER", "")
    monkeypatch.setenv("STRATA_BLOCK_SIZE", "4Mi")
    monkeypatch.setenv("STRATA_SHORT_CIRCUIT_DIR", "/var/lib/strata/sc")
    monkeypatch.setenv("STRATA_RETRY_ATTEMPTS", "3")  # another part's setting: not this model's
    env = ServerEnvironment()
    assert env.short_circuit_dir == Path("/var/lib/strata/sc") and env.master == ""
    config = load_server_config(None, env)
    assert config.block_size == 4 << 20 and config.master_address.endswith(":19998")


def test_the_server_environment_defaults_to_nothing_set(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("BLOCK_SIZE", "MASTER", "NODE_NAME", "HOSTNAME", "ADVERTISE_HOST", "POD_IP", "WORKER_ID", "POD_NAME",
                 "SHORT_CIRCUIT_DIR"):
        monkeypatch.delenv(f"STRATA_{name}", raising=False)
    env = ServerEnvironment()
    assert env.model_dump() == {"block_size": "", "master": "", "node_name": "", "hostname": "", "advertise_host": "",
                                "pod_ip": "", "worker_id": "", "pod_name": "", "short_circuit_dir": None}


def test_store_timeouts_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = StoreTimeouts()
    assert (defaults.connect_timeout, defaults.read_timeout, defaults.deadline, defaults.stall_timeout,
            defaults.stale_after) == (5.0, 10.0, 20.0, 60.0, 3.0)
    monkeypatch.setenv("STRATA_STORE_DEADLINE", "45")
    monkeypatch.setenv("STRATA_STORE_STALE_AFTER", "0.5")
    settings = StoreTimeouts()
    assert (settings.deadline, settings.stale_after, settings.read_timeout) == (45.0, 0.5, 10.0)
    monkeypatch.setenv("STRATA_STORE_DEADLINE", "0")
    with pytest.raises(InvalidArgument, match="^STRATA_STORE_DEADLINE='0' is not valid: Input should be greater than 0"):
        StoreTimeouts()
    monkeypatch.setenv("STRATA_STORE_DEADLINE", "soon")
    with pytest.raises(InvalidArgument, match="^STRATA_STORE_DEADLINE='soon' is not valid: Input should be a valid number"):
        StoreTimeouts()


def test_retry_settings_defaults_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = RetrySettings()
    assert (defaults.attempts, defaults.base_delay, defaults.max_delay) == (5, 0.05, 2.0)
    monkeypatch.setenv("STRATA_RETRY_ATTEMPTS", "3")
    monkeypatch.setenv("STRATA_RETRY_MAX_DELAY", "0.5")
    settings = RetrySettings()
    assert settings.attempts == 3 and settings.max_delay == 0.5
    monkeypatch.setenv("STRATA_RETRY_ATTEMPTS", "0")
    with pytest.raises(InvalidArgument,
                       match="^STRATA_RETRY_ATTEMPTS='0' is not valid: Input should be greater than or equal to 1$"):
        RetrySettings()
