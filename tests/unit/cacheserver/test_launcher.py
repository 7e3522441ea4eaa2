"""The process launcher: own session, log file, ready waits with deadlines, stopping by group."""

from __future__ import annotations

import http.server
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from strata.cacheserver import launcher


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


@pytest.fixture
def children() -> Iterator[list[launcher.Child]]:
    started: list[launcher.Child] = []
    yield started
    for child in started:
        child.stop(grace=1)


def start(children: list[launcher.Child], tmp_path: Path, code: str, *, env: dict[str, str] | None = None,
          cwd: Path | None = None, stdout_pipe: bool = False) -> launcher.Child:
    child = launcher.start("sleeper", python(code), tmp_path / "logs" / "sleeper.log", env=env, cwd=cwd,
                           stdout_pipe=stdout_pipe)
    children.append(child)
    return child


def test_a_child_runs_in_its_own_session_with_its_output_in_its_log(children: list[launcher.Child], tmp_path: Path) -> None:
    child = start(children, tmp_path, "import sys; print('out'); print('err', file=sys.stderr); "
                                      "print(sys.stdin.read() == '', flush=True)")
    assert child.process.wait(timeout=30) == 0
    assert child.log.read_text().split() == ["out", "err", "True"]
    running = start(children, tmp_path, "import time; time.sleep(60)")
    assert os.getsid(running.pid) == running.pid and os.getpgid(running.pid) == running.pid


def test_the_environment_and_folder_are_the_given_ones(children: list[launcher.Child], tmp_path: Path) -> None:
    child = start(children, tmp_path, "import os; print(os.environ.get('STRATA_X'), os.getcwd())",
                  env={"STRATA_X": "given", "PATH": os.environ.get("PATH", "")}, cwd=tmp_path)
    child.process.wait(timeout=30)
    assert child.log.read_text().split() == ["given", str(tmp_path)]


def test_wait_ready_returns_once_the_condition_holds(children: list[launcher.Child], tmp_path: Path) -> None:
    flag = tmp_path / "ready"
    child = start(children, tmp_path, f"import pathlib, time; time.sleep(0.3); pathlib.Path({str(flag)!r}).touch(); time.sleep(60)")
    child.wait_ready(flag.exists, f"{flag} exists", timeout=30)
    assert child.alive()


def test_a_child_that_exits_while_starting_is_named_with_its_code_and_log(children: list[launcher.Child], tmp_path: Path) -> None:
    child = start(children, tmp_path, "import sys; print('config: no tiers', flush=True); sys.exit(3)")
    with pytest.raises(launcher.LaunchError) as failed:
        child.wait_ready(lambda: False, "it answers /healthz on port 1", timeout=30)
    message = str(failed.value)
    assert message.startswith("sleeper exited with code 3 while starting (waiting until it answers /healthz on port 1)")
    assert "  | config: no tiers" in message and str(child.log) in message


def test_a_child_not_ready_by_the_deadline_is_stopped(children: list[launcher.Child], tmp_path: Path) -> None:
    child = start(children, tmp_path, "print('still loading', flush=True); import time; time.sleep(60)")
    started = time.monotonic()
    with pytest.raises(launcher.LaunchError, match=r"sleeper did not get ready within 1s \(waiting until never\)") as failed:
        launcher.wait_ready([(child, lambda: False, "never")], timeout=1)
    assert time.monotonic() - started < 10
    assert "  | still loading" in str(failed.value)
    assert not child.alive()


def test_one_deadline_for_several_children(children: list[launcher.Child], tmp_path: Path) -> None:
    a, b = (start(children, tmp_path, "import time; time.sleep(60)") for _ in range(2))
    calls: list[str] = []

    def ready(name: str) -> bool:
        calls.append(name)
        return calls.count(name) > (1 if name == "a" else 3)

    launcher.wait_ready([(a, lambda: ready("a"), "a"), (b, lambda: ready("b"), "b")], timeout=30)
    assert calls.count("a") == 2 and calls.count("b") == 4


def test_read_port_takes_the_first_line(children: list[launcher.Child], tmp_path: Path) -> None:
    child = start(children, tmp_path, "import time; time.sleep(0.2); print('PORT 4321', flush=True); time.sleep(60)",
                  stdout_pipe=True)
    assert child.read_port(timeout=30) == 4321


@pytest.mark.parametrize("code,message", [
    ("print('listening on 80', flush=True); import time; time.sleep(60)", "printed b'listening on 80\\\\n' instead of `PORT <n>`"),
    ("import sys; sys.exit(2)", "exited with code 2 before it printed its port"),
    ("import time; time.sleep(60)", "did not print its port within 1s"),
])
def test_read_port_failures_say_what_happened_and_stop_the_child(children: list[launcher.Child], tmp_path: Path,
                                                                 code: str, message: str) -> None:
    child = start(children, tmp_path, code, stdout_pipe=True)
    with pytest.raises(launcher.LaunchError, match=f"^sleeper {message}"):
        child.read_port(timeout=1)
    assert not child.alive()


def test_stop_kills_a_child_that_ignores_sigterm_after_the_grace(children: list[launcher.Child], tmp_path: Path) -> None:
    ready = tmp_path / "ready"
    child = start(children, tmp_path, "import pathlib, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
                                      f"pathlib.Path({str(ready)!r}).touch(); time.sleep(60)")
    child.wait_ready(ready.exists, "it ignores SIGTERM", timeout=30)
    started = time.monotonic()
    assert child.stop(grace=0.5) == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < 10


def test_stop_ends_what_the_child_left_in_its_group(children: list[launcher.Child], tmp_path: Path) -> None:
    """The leader ends on SIGTERM; a member of its group that ignores SIGTERM goes too."""
    pid_file = tmp_path / "member"
    child = start(children, tmp_path, (
        "import pathlib, signal, subprocess, sys, time\n"
        "member = subprocess.Popen([sys.executable, '-c', 'import signal, time; "
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(member.pid))\n"
        "time.sleep(60)\n"))
    child.wait_ready(lambda: pid_file.exists() and pid_file.read_text(), "it started its member", timeout=30)
    member = int(pid_file.read_text())
    assert child.stop(grace=5) == -signal.SIGTERM
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(member):
        time.sleep(0.05)
    assert not _running(member)


def test_stop_with_another_signal_and_when_already_gone(children: list[launcher.Child], tmp_path: Path) -> None:
    child = start(children, tmp_path, "import time; time.sleep(60)")
    assert child.stop(sig=signal.SIGKILL) == -signal.SIGKILL
    assert child.stop() == -signal.SIGKILL


def test_stop_groups_stops_processes_by_pid(children: list[launcher.Child], tmp_path: Path) -> None:
    a, b = (start(children, tmp_path, "import time; time.sleep(60)") for _ in range(2))
    b.stop()
    assert launcher.stop_groups([a.pid, b.pid], grace=5) == [a.pid]
    assert not launcher.pid_alive(a.pid) and not launcher.pid_alive(b.pid)


def test_a_parent_death_signal_ends_the_child_with_its_parent(tmp_path: Path) -> None:
    log = tmp_path / "grandchild.log"
    parent = subprocess.run(python(
        "import signal, sys; from pathlib import Path; from strata.cacheserver import launcher; "
        f"c = launcher.start('g', [sys.executable, '-c', 'import time; time.sleep(60)'], Path({str(log)!r}), "
        "parent_death_signal=signal.SIGKILL); print(c.pid)"), capture_output=True, text=True, timeout=60, check=True)
    grandchild = int(parent.stdout)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(grandchild):
        time.sleep(0.05)
    assert not _running(grandchild)


def test_http_ok() -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/healthz" else 503)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        assert launcher.http_ok(port)
        assert not launcher.http_ok(port, "/other")
    finally:
        server.shutdown()
        server.server_close()
    assert not launcher.http_ok(launcher.free_port())


def test_tail_of_a_log(tmp_path: Path) -> None:
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(30)))
    assert launcher.tail(log, 2) == "  | line 28\n  | line 29"
    assert launcher.tail(tmp_path / "none.log") == f"(no log at {tmp_path / 'none.log'})"


def _running(pid: int) -> bool:
    """Whether pid is a process that has not exited (a zombie, not reaped by its parent yet, has)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
