#!/usr/bin/env bash
# mypy --strict over the package by its import names. The folders contract/, operator/ and
# cacheserver/ install as strata.contract, strata.operator and strata.cacheserver; mypy reads the source
# tree, so give it that layout through links in .typecheck/ (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .typecheck && mkdir -p .typecheck/strata
ln -s ../../contract .typecheck/strata/contract
ln -s ../../cacheserver .typecheck/strata/cacheserver
ln -s ../../operator .typecheck/strata/operator
cd .typecheck
MYPYPATH=. exec "${PYTHON:-../.venv/bin/python}" -P -m mypy --config-file ../pyproject.toml -p strata.contract -p strata.cacheserver -p strata.operator "$@"
