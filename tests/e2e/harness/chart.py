"""How the chart is installed on the harness's cluster: the release, its namespace, and the
values that point the chart at the images every node has imported (the harness never pulls).
One place for the command the harness prints at start, tests/e2e/README.md shows and
test_strata.py runs."""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from pathlib import Path

RELEASE = "strata"
RELEASE_NS = "strata-system"
CHART = Path(__file__).resolve().parents[3] / "charts" / "strata"

# The images tests/e2e/images/build.sh makes (tagged localhost/<name>:e2e), imported by each
# node's containerd at start: never pulled.
LOCAL_IMAGE_VALUES = (
    "--set", "image.repository=localhost",
    "--set", "image.tag=e2e",
    "--set", "image.pullPolicy=Never",
    "--set", "csi.registrar.image=localhost/csi-registrar:e2e",
    # Every node is a kubelet of this one machine: the disk tiers' node folders go to
    # /run/strata, a folder of each node's own (the default, /var/lib/strata/cache, would be
    # the machine's, shared by the three nodes and kept after the run).
    "--set", "operator.nodeCacheRoot=/run/strata/cache",
    # The same for the node plugin's local copies of passthrough volumes.
    "--set", "csi.passthrough.dir=/run/strata/fuse-copies",
)


def install_command(values: Sequence[str], chart: Path | str = CHART) -> list[str]:
    """`helm upgrade --install` of the chart as release RELEASE in RELEASE_NS with `values`."""
    return ["helm", "upgrade", "--install", RELEASE, str(chart), "-n", RELEASE_NS, "--create-namespace", *values]


def install_line(chart: Path | str = CHART) -> str:
    """The command, as a shell line, that installs the chart with the local images."""
    return shlex.join(install_command(LOCAL_IMAGE_VALUES, chart))


def install_note() -> str:
    """What the harness prints at start: the install command, to copy."""
    return f"# install the chart with the images every node has (as test_strata.py does):\n{install_line()}"
