"""`python -m strata.operator`: the `strata-operator` command."""

import sys

from strata.operator.cli import main

sys.exit(main())
