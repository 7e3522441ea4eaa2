#!/usr/bin/env bash
# Regenerate requirements.lock, the pinned versions of every Python package Strata and its
# tests use (pyproject.toml's dependencies and the `test` extra, for CPython 3.11 on
# x86_64 Linux). `make venv`, both images (tests/e2e/images.sh) and CI install with it as a
# pip constraints file, so no install resolves (or backtracks) again. Run it after changing
# the dependencies in pyproject.toml, and commit the result.
#
# Usage: scripts/lock.sh [--upgrade]   (--upgrade: newest versions, not the locked ones)
set -euo pipefail
cd "$(dirname "$0")/.."
tool="${STRATA_LOCK_VENV:-$HOME/.cache/strata/lock-venv}"
if [[ ! -x "$tool/bin/uv" ]]; then
  python3 -m venv "$tool"
  "$tool/bin/pip" install --quiet "uv>=0.5,<1"
fi
upgrade=()
[[ "${1:-}" == --upgrade ]] && upgrade=(--upgrade)
"$tool/bin/uv" pip compile pyproject.toml --extra test \
  --python-version 3.11 --python-platform x86_64-unknown-linux-gnu \
  --no-header --annotation-style line ${upgrade[@]+"${upgrade[@]}"} \
  -o requirements.lock.new --quiet
{
  echo "# Pinned Python dependencies (pip constraints). Made by scripts/lock.sh from pyproject.toml;"
  echo "# do not edit: change pyproject.toml and run scripts/lock.sh."
  cat requirements.lock.new
} >requirements.lock
rm -f requirements.lock.new
echo "requirements.lock: $(grep -c '==' requirements.lock) packages"
