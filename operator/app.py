"""For `kopf run -m strata.operator.app`: the handlers in kopf's default registry.
Production uses `strata-operator run` (strata.operator.main.run), which sets up JSON logs too."""

from __future__ import annotations

import kopf

from strata.operator.handlers import register
from strata.operator.settings import OperatorSettings

register(kopf.get_default_registry(), OperatorSettings())
