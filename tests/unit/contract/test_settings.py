from __future__ import annotations

import pytest
from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from strata.contract.errors import InvalidArgument
from strata.contract.settings import EnvironmentSettings, variable_name


class Example(EnvironmentSettings):
    model_config = SettingsConfigDict(env_prefix="STRATA_EXAMPLE_", frozen=True, extra="forbid")

    attempts: int = Field(default=5, ge=1)
    low: float = 1.0
    high: float = 2.0

    @model_validator(mode="after")
    def _ordered(self) -> Example:
        if self.low > self.high:
            raise ValueError("STRATA_EXAMPLE_LOW must not exceed STRATA_EXAMPLE_HIGH")
        return self


def test_the_variable_of_a_field() -> None:
    assert variable_name(Example, "attempts") == "STRATA_EXAMPLE_ATTEMPTS"


def test_values_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert Example().attempts == 5
    monkeypatch.setenv("STRATA_EXAMPLE_ATTEMPTS", "7")
    assert Example().attempts == 7


@pytest.mark.parametrize("value,message", [
    ("seven", "STRATA_EXAMPLE_ATTEMPTS='seven' is not valid: Input should be a valid integer"),
    ("0", "STRATA_EXAMPLE_ATTEMPTS='0' is not valid: Input should be greater than or equal to 1"),
])
def test_a_bad_value_names_the_variable_and_the_value(monkeypatch: pytest.MonkeyPatch, value: str, message: str) -> None:
    monkeypatch.setenv("STRATA_EXAMPLE_ATTEMPTS", value)
    with pytest.raises(InvalidArgument) as caught:
        Example()
    assert str(caught.value).startswith(message)
    assert "validation error" not in str(caught.value)  # one sentence, not pydantic's report


def test_every_bad_value_is_named_and_checks_of_several_variables_keep_their_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STRATA_EXAMPLE_ATTEMPTS", "x")
    monkeypatch.setenv("STRATA_EXAMPLE_LOW", "y")
    with pytest.raises(InvalidArgument, match="STRATA_EXAMPLE_ATTEMPTS='x' .*; STRATA_EXAMPLE_LOW='y' "):
        Example()
    monkeypatch.delenv("STRATA_EXAMPLE_ATTEMPTS")
    monkeypatch.setenv("STRATA_EXAMPLE_LOW", "3")
    with pytest.raises(InvalidArgument, match="^STRATA_EXAMPLE_LOW must not exceed STRATA_EXAMPLE_HIGH$"):
        Example()
