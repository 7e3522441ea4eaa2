from __future__ import annotations

from pathlib import Path

import pytest

from strata.contract.errors import InvalidArgument
from strata.operator.settings import MetricsSettings, OperatorSettings, WebhookSettings


def test_defaults() -> None:
    operator = OperatorSettings()
    assert operator.server_image.startswith("strata-server:")
    assert operator.model_dump(exclude={"server_image"}) == {
        "image_pull_policy": "IfNotPresent", "cluster_domain": "", "reconcile_interval": 30.0, "rpc_timeout": 10.0,
        "unmount_timeout": 60.0, "store_patience": 120.0, "report_ttl": 5.0, "retry_delay": 5.0, "namespace": "",
        "csi_tokens_secret": "", "kept_tokens_secret": "", "tenant_role": "", "service_account": "",
        "node_cache_root": "/var/lib/strata/cache", "warm_check_interval": 5.0,
    }
    assert MetricsSettings().model_dump() == {"port": 0, "bind": "0.0.0.0"}
    assert WebhookSettings().model_dump() == {
        "enabled": False, "port": 9443, "cert_dir": Path("/etc/strata/webhook"), "certificate": "files", "secret": "",
        "service": "", "configuration": "", "certificate_days": 365.0, "renew_before_days": 30.0,
        "check_interval": 3600.0, "lookup_timeout": 2.0,
    }


def test_the_environment_overrides(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_OPERATOR_RPC_TIMEOUT", "20")
    monkeypatch.setenv("STRATA_OPERATOR_METRICS_PORT", "8081")
    monkeypatch.setenv("STRATA_OPERATOR_WEBHOOK_ENABLED", "true")
    monkeypatch.setenv("STRATA_OPERATOR_WEBHOOK_CERT_DIR", "/tls")
    assert OperatorSettings().rpc_timeout == 20.0
    assert MetricsSettings().port == 8081
    webhook = WebhookSettings()
    assert webhook.enabled and webhook.cert_dir == Path("/tls")


@pytest.mark.parametrize("model,name,value,message", [
    (OperatorSettings, "STRATA_OPERATOR_RPC_TIMEOUT", "10s", "Input should be a valid number"),
    (OperatorSettings, "STRATA_OPERATOR_NODE_CACHE_ROOT", "cache",
     "STRATA_OPERATOR_NODE_CACHE_ROOT must be an absolute, normalised path, got 'cache'"),
    (MetricsSettings, "STRATA_OPERATOR_METRICS_PORT", "70000", "Input should be less than 65536"),
    (WebhookSettings, "STRATA_OPERATOR_WEBHOOK_ENABLED", "maybe", "Input should be a valid boolean"),
    (WebhookSettings, "STRATA_OPERATOR_WEBHOOK_CERTIFICATE", "self", "Input should be 'operator' or 'files'"),
])
def test_a_bad_value_names_the_variable_and_the_value(monkeypatch: pytest.MonkeyPatch, model: type[MetricsSettings],
                                                      name: str, value: str, message: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(InvalidArgument, match=f"^{name}='{value}' is not valid: {message}"):
        model()


def test_checks_of_several_variables_name_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_OPERATOR_WEBHOOK_RENEW_BEFORE_DAYS", "400")
    with pytest.raises(InvalidArgument, match=r"^STRATA_OPERATOR_WEBHOOK_RENEW_BEFORE_DAYS \(400\) must be less than "
                                              r"STRATA_OPERATOR_WEBHOOK_CERTIFICATE_DAYS \(365\)$"):
        WebhookSettings()
    monkeypatch.delenv("STRATA_OPERATOR_WEBHOOK_RENEW_BEFORE_DAYS")
    monkeypatch.setenv("STRATA_OPERATOR_CSI_TOKENS_SECRET", "tokens")
    with pytest.raises(InvalidArgument, match="^STRATA_OPERATOR_CSI_TOKENS_SECRET is set but STRATA_OPERATOR_NAMESPACE"):
        OperatorSettings()
