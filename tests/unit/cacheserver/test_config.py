from __future__ import annotations

from pathlib import Path

import pytest

from strata.cacheserver.config import ServerEnvironment, load_server_config
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
