"""The `helm` command that installs the chart on the e2e harness's cluster is written down
(tests/e2e/README.md), printed by the harness at start, and is the one test_strata.py runs."""

from __future__ import annotations

import importlib
import shlex
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[2]
E2E = REPO / "tests" / "e2e"


@pytest.fixture
def e2e(monkeypatch: pytest.MonkeyPatch) -> None:
    """The e2e folder importable, as its conftest makes it, and no STRATA_E2E_HELM_ARGS."""
    monkeypatch.syspath_prepend(str(E2E))
    monkeypatch.delenv("STRATA_E2E_HELM_ARGS", raising=False)


def test_the_readme_shows_the_command_with_the_local_images(e2e: None) -> None:
    chart = importlib.import_module("harness.chart")
    text = (E2E / "README.md").read_text()
    line = chart.install_line("charts/strata")
    assert line in text
    for value in ("image.repository=localhost", "image.tag=e2e", "image.pullPolicy=Never",
                  "csi.registrar.image=localhost/csi-registrar:e2e"):
        assert f"--set {value}" in line


def test_the_printed_command_is_the_one_the_suite_installs(e2e: None) -> None:
    chart = importlib.import_module("harness.chart")
    printed = chart.install_note().splitlines()[-1]
    argv = shlex.split(printed)
    assert argv == chart.install_command(chart.LOCAL_IMAGE_VALUES)
    assert Path(argv[4]) == REPO / "charts" / "strata"
    # test_strata.py runs install_command(chart_args(cluster), chart_dir); on the harness
    # chart_args are the harness's values and then the operator's pace.
    suite = importlib.import_module("test_strata")
    harness_cluster = SimpleNamespace(harness={"helm_args": list(chart.LOCAL_IMAGE_VALUES)})
    values = suite.chart_args(harness_cluster)
    assert values == [*chart.LOCAL_IMAGE_VALUES, *suite.OPERATOR_PACE]
    assert suite.install_command(values, REPO / "charts" / "strata")[:len(argv)] == argv
    assert "print(chart.install_note()" in (E2E / "harness" / "__main__.py").read_text()
