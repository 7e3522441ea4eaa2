#!/usr/bin/env python3
"""A picture of the Grafana dashboard (charts/strata/files/dashboard.json) drawn from what
its panels' queries return from a Prometheus that scrapes a Strata cluster: the README's
docs/dashboard.png.

    pip install '.[bench]'    # matplotlib
    python scripts/dashboard_picture.py --prometheus http://127.0.0.1:9090 \\
        --namespace data --cluster demo --minutes 15 --out docs/dashboard.png

`--save-data FILE` keeps the query results (JSON), `--data FILE` draws from such a file
instead of asking a Prometheus (the e2e suite saves one: STRATA_E2E_DASHBOARD_DATA).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

DASHBOARD = Path(__file__).resolve().parents[1] / "charts" / "strata" / "files" / "dashboard.json"
# Prometheus answers a query within this many seconds, or the script gives up.
QUERY_TIMEOUT = 30


def panels() -> list[dict[str, Any]]:
    return list(json.loads(DASHBOARD.read_text())["panels"])


def concrete(expr: str, namespace: str, cluster: str, rate_interval: str = "1m") -> str:
    """A panel's query with the dashboard's variables given values."""
    return (expr.replace("$__rate_interval", rate_interval)
            .replace("$namespace", namespace).replace("$cluster", cluster))


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legend format (`{{label}}`) filled in."""
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt) or json.dumps(labels)


def query(prometheus: str, path: str, params: dict[str, str]) -> list[dict[str, Any]]:
    url = f"{prometheus.rstrip('/')}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=QUERY_TIMEOUT) as answer:
        body = json.load(answer)
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus refused {params.get('query')!r}: {body.get('error')}")
    return list(body["data"]["result"])


def collect(prometheus: str, namespace: str, cluster: str, minutes: float, step: float) -> list[dict[str, Any]]:
    """Each panel's series over the last `minutes`: [{title, unit, series: [{legend, points}]}]."""
    end = time.time()
    out = []
    for panel in panels():
        series = []
        for target in panel["targets"]:
            params = {"query": concrete(target["expr"], namespace, cluster), "start": str(end - 60 * minutes),
                      "end": str(end), "step": str(step)}
            for result in query(prometheus, "query_range", params):
                series.append({"legend": legend(target.get("legendFormat", ""), result["metric"]),
                               "points": [[float(t), float(v)] for t, v in result["values"]]})
        out.append({"title": panel["title"], "unit": panel["fieldConfig"]["defaults"].get("unit", ""), "series": series})
    return out


def draw(data: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = 2
    rows = math.ceil(len(data) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(14, 3.2 * rows), squeeze=False)
    start = min((p[0] for panel in data for s in panel["series"] for p in s["points"]), default=0.0)
    for ax, panel in zip(axes.flat, data):
        for s in panel["series"]:
            xs = [(t - start) / 60 for t, v in s["points"] if not math.isnan(v)]
            ys = [v for _, v in s["points"] if not math.isnan(v)]
            ax.plot(xs, ys, label=s["legend"][:40])
        ax.set_title(f"{panel['title']} ({panel['unit']})", fontsize=10)
        ax.set_xlabel("minutes", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(alpha=0.3)
        if panel["series"]:
            ax.legend(fontsize=7, loc="upper left")
    for ax in list(axes.flat)[len(data):]:
        ax.axis("off")
    fig.suptitle("Strata (charts/strata/files/dashboard.json)", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    fig.savefig(out, dpi=80)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prometheus", help="Prometheus URL, e.g. http://127.0.0.1:9090")
    parser.add_argument("--data", type=Path, help="draw from saved query results instead")
    parser.add_argument("--namespace", default=".*", help="the dashboard's namespace variable")
    parser.add_argument("--cluster", default=".*", help="the dashboard's CacheCluster variable")
    parser.add_argument("--minutes", type=float, default=15.0)
    parser.add_argument("--step", type=float, default=5.0, help="seconds between points")
    parser.add_argument("--save-data", type=Path)
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    args = parser.parse_args()
    if args.data:
        data = json.loads(args.data.read_text())
    elif args.prometheus:
        data = collect(args.prometheus, args.namespace, args.cluster, args.minutes, args.step)
    else:
        parser.error("give --prometheus URL or --data FILE")
    if args.save_data:
        args.save_data.write_text(json.dumps(data))
    draw(data, args.out)
    print(f"wrote {args.out} ({len(data)} panels)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
