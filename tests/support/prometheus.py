"""A real Prometheus server (Debian's package) on 127.0.0.1 for tests: it scrapes the
targets written to its targets file (file discovery) with the scrape job given, evaluates
the chart's alert rules, and answers the HTTP API."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
FILES = REPO / "charts" / "strata" / "files"
# Seconds Prometheus has to start answering.
START_TIMEOUT = 60


def available() -> bool:
    return shutil.which("prometheus") is not None and shutil.which("promtool") is not None


class Prometheus:
    """`prometheus` scraping every `interval` the target groups `scrape()` writes, with the
    relabelings of `job` (a scrape config without its discovery), rules: files/alerts.yaml."""

    def __init__(self, folder: Path, job: dict[str, Any] | None = None, interval: str = "2s") -> None:
        self.targets = folder / "targets.json"
        self.targets.write_text("[]")
        job = dict(job or {"job_name": "strata"})
        job.pop("kubernetes_sd_configs", None)
        job["file_sd_configs"] = [{"files": [str(self.targets)], "refresh_interval": "1s"}]
        job["scrape_interval"] = interval
        config = {"global": {"scrape_interval": interval, "evaluation_interval": interval},
                  "rule_files": [str(FILES / "alerts.yaml")], "scrape_configs": [job]}
        (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = folder / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [shutil.which("prometheus") or "prometheus", f"--config.file={folder / 'prometheus.yml'}",
             f"--storage.tsdb.path={folder / 'data'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                self.api("status/buildinfo")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"prometheus did not start: {self.log_path.read_text()[-2000:]}") from None
                time.sleep(0.2)

    def scrape(self, groups: list[dict[str, Any]]) -> None:
        """Scrape these target groups ([{targets: [HOST:PORT], labels: {...}}]) from now on."""
        self.targets.write_text(json.dumps(groups))

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.url}/api/v1/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        with urllib.request.urlopen(url, timeout=10) as answer:
            body = json.load(answer)
        if body.get("status") != "success":
            raise AssertionError(f"Prometheus refused {path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


def dashboard_picture() -> Any:
    """scripts/dashboard_picture.py as a module: the dashboard's panels and their queries."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dashboard_picture", REPO / "scripts" / "dashboard_picture.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def empty_panels(prometheus: Prometheus, namespace: str, cluster: str) -> list[str]:
    """The dashboard's queries (variables set to `namespace` and `cluster`) that return no data."""
    picture = dashboard_picture()
    return [f"{panel['title']}: {target['expr']}" for panel in picture.panels() for target in panel["targets"]
            if not prometheus.query(picture.concrete(target["expr"], namespace, cluster))]
