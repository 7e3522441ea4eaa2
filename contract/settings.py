"""Settings read from `STRATA_*` environment variables: the base every process's settings
models share (servers, clients, the operator), so that a bad value of any variable stops the
process with one clear error naming the variable and the value it was given, where pydantic
alone names only the field of a model.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from .errors import InvalidArgument


class EnvironmentSettings(BaseSettings):
    """A settings model read from the environment (`model_config["env_prefix"]` plus the field
    name); a value it refuses raises InvalidArgument naming the variable and the value."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InvalidArgument(settings_error(type(self), exc)) from None


def variable_name(model: type[BaseSettings], field: str) -> str:
    """The environment variable that sets `field` of `model`, e.g. STRATA_RETRY_ATTEMPTS."""
    return f"{model.model_config.get('env_prefix', '')}{field}".upper()


def settings_error(model: type[BaseSettings], exc: ValidationError) -> str:
    """What was wrong with the environment, one clause per refused value: the variable, the
    value it was given and what it takes."""
    problems = []
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        if error["loc"]:
            name = variable_name(model, str(error["loc"][0]))
            problems.append(f"{name}={error['input']!r} is not valid: {message}")
        else:  # a check of several variables together; its message names them
            problems.append(message)
    return "; ".join(problems)
