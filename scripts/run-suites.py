"""Run test suites side by side: each its own pytest process, every output line tagged with
the suite's name, and one closing line for all of them.

    run-suites.py --suite NAME [--prepare CMD]... [--nice N] [--python PATH] [--after NAME]
                  -- PYTEST_ARGS... [--suite ...]

The end-to-end suite spends most of its time waiting for pods, the integration suite for
servers on loopback: run one after the other on this project's 2-core machine they take
twice the wall time they need. A suite's `--prepare` commands (e.g. building the e2e cluster's
binaries and images) run first, one after the other, inside that suite's slot, so the other
suites start at once; `--nice` lowers their CPU priority (a compile yields to timing-bound
tests). `--python` is the interpreter that runs pytest (default: this one), which a prepare
step may make first: this script needs only the standard library, so it can start before the
venv. `--after NAME`: this suite's pytest starts only once suite NAME's first prepare step
succeeded (the one that makes the venv both run in: NAME's later steps, such as its lint, are
not waited for); its own prepare steps do not wait.

Exits 0 only when every prepare command and every pytest run exited 0. The last line is the
sum over the suites, `N passed, N failed, N skipped`, from each run's JUnit XML. Ctrl-C or
SIGTERM ends every suite (their own process groups) and still prints what was counted.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

_print_lock = threading.Lock()


def say(tag: str, line: str) -> None:
    with _print_lock:
        sys.stdout.write(f"[{tag}] {line}" if line.endswith("\n") else f"[{tag}] {line}\n")
        sys.stdout.flush()


@dataclass
class Suite:
    name: str
    pytest_args: list[str]
    prepare: list[str] = field(default_factory=list)
    nice: int = 0
    python: str = sys.executable
    after: str = ""
    junit: Path = Path()
    returncode: int | None = None
    failed_step: str = ""
    seconds: float = 0.0
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    # Set once the first prepare step ended (or there is none); `ready` says whether it succeeded.
    prepared: threading.Event = field(default_factory=threading.Event, repr=False)
    ready: bool = False

    def counts(self) -> tuple[int, int, int]:
        """(passed, failed, skipped) from the JUnit XML; failed counts errors too."""
        try:
            root = ET.parse(self.junit).getroot()
        except (OSError, ET.ParseError):
            return 0, 0, 0
        tests = failures = errors = skipped = 0
        for suite in root.iter("testsuite"):
            tests += int(suite.get("tests", 0))
            failures += int(suite.get("failures", 0))
            errors += int(suite.get("errors", 0))
            skipped += int(suite.get("skipped", 0))
        return tests - failures - errors - skipped, failures + errors, skipped


def parse(argv: list[str]) -> list[Suite]:
    """Split argv at each --suite; within one, options come before `--`, pytest's after."""
    suites: list[Suite] = []
    groups: list[list[str]] = []
    for arg in argv:
        if arg == "--suite":
            groups.append([])
        elif not groups:
            raise SystemExit(f"run-suites.py: expected --suite NAME first, got {arg!r}")
        else:
            groups[-1].append(arg)
    for group in groups:
        if "--" not in group:
            raise SystemExit(f"run-suites.py: suite {group[:1]} has no `--` before its pytest arguments")
        cut = group.index("--")
        options = argparse.ArgumentParser(prog="run-suites.py --suite")
        options.add_argument("name")
        options.add_argument("--prepare", action="append", default=[])
        options.add_argument("--nice", type=int, default=0)
        options.add_argument("--python", default=sys.executable)
        options.add_argument("--after", default="")
        ns = options.parse_args(group[:cut])
        suites.append(Suite(ns.name, group[cut + 1:], ns.prepare, ns.nice, ns.python, ns.after))
    if not suites:
        raise SystemExit("run-suites.py: no --suite given")
    names = {suite.name for suite in suites}
    for suite in suites:
        if suite.after and (suite.after not in names or suite.after == suite.name):
            raise SystemExit(f"run-suites.py: suite {suite.name} comes --after {suite.after!r}, "
                             f"which is not another suite ({', '.join(sorted(names))})")
    return suites


def _stream(tag: str, proc: subprocess.Popen[bytes]) -> None:
    assert proc.stdout is not None
    for raw in iter(proc.stdout.readline, b""):
        say(tag, raw.decode(errors="replace"))


def _run(suite: Suite, argv: list[str], nice: int, stopping: threading.Event) -> int:
    def lower_priority() -> None:
        os.setsid()  # its own group: a stop reaches its children too
        if nice:
            os.nice(nice)

    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=lower_priority)
    suite.proc = proc
    if stopping.is_set():  # a stop that came while it started
        _signal_group(proc, signal.SIGTERM)
    _stream(suite.name, proc)
    return proc.wait()


def run_suite(suite: Suite, before: Suite | None, stopping: threading.Event) -> None:
    started = time.monotonic()
    try:
        for i, step in enumerate(suite.prepare):
            say(suite.name, f"preparing: {step}" + (f" (nice {suite.nice})" if suite.nice else ""))
            code = _run(suite, ["bash", "-c", step], suite.nice, stopping)
            if code != 0:
                suite.returncode, suite.failed_step = code, f"prepare ({step})"
                return
            if i == 0:
                suite.ready = True
                suite.prepared.set()
        suite.ready = True
        suite.prepared.set()
        if before is not None:
            while not before.prepared.wait(timeout=0.5) and not stopping.is_set():
                pass
            if not before.ready:
                suite.returncode, suite.failed_step = 1, f"not run: the prepare step of {before.name} failed"
                return
        if stopping.is_set():
            suite.returncode, suite.failed_step = 1, "stopped before pytest started"
            return
        pytest = [suite.python, "-m", "pytest", f"--junitxml={suite.junit}", *suite.pytest_args]
        suite.returncode = _run(suite, pytest, 0, stopping)
        if suite.returncode != 0:
            suite.failed_step = f"pytest (exit {suite.returncode})"
    finally:
        suite.prepared.set()  # a suite waiting on this one goes on (and sees `ready`)
        suite.seconds = time.monotonic() - started


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            pass


def main(argv: list[str]) -> int:
    suites = parse(argv)
    stopping = threading.Event()

    def stop(signum: int, _frame: FrameType | None) -> None:
        stopping.set()
        for suite in suites:
            if suite.proc is not None:
                _signal_group(suite.proc, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    with tempfile.TemporaryDirectory(prefix="strata-suites-") as tmp:
        threads = []
        by_name = {suite.name: suite for suite in suites}
        for suite in suites:
            suite.junit = Path(tmp) / f"{suite.name}.xml"
            before = by_name[suite.after] if suite.after else None
            thread = threading.Thread(target=run_suite, args=(suite, before, stopping), name=suite.name)
            thread.start()
            threads.append(thread)
        for thread in threads:
            while thread.is_alive():  # join with a timeout keeps signals deliverable
                thread.join(timeout=0.5)
        totals = [0, 0, 0]
        print("\n== suites")
        for suite in suites:
            passed, failed, skipped = suite.counts()
            totals = [totals[0] + passed, totals[1] + failed, totals[2] + skipped]
            verdict = "ok" if suite.returncode == 0 else f"FAILED in {suite.failed_step}"
            print(f"   {suite.name}: {passed} passed, {failed} failed, {skipped} skipped in "
                  f"{suite.seconds:.0f}s: {verdict}  (pytest {shlex.join(suite.pytest_args)})")
    print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
    return 0 if all(suite.returncode == 0 for suite in suites) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
