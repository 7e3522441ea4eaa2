"""scripts/run-suites.py, which `make test` runs: suites side by side, one closing line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "run-suites.py"


def _suite_dir(tmp: Path, name: str, body: str) -> Path:
    folder = tmp / name
    folder.mkdir()
    (folder / f"test_{name}.py").write_text(body)
    return folder


def _run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-P", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


def _pytest_args(folder: Path) -> list[str]:
    # No project conftest, no plugins' warnings-as-errors from pyproject.toml: a bare run.
    return ["-p", "no:cacheprovider", "-c", os.devnull, "--rootdir", str(folder), str(folder)]


def _meet(here: Path, there: Path) -> str:
    """A test that marks `here` and waits for `there`: it passes only while the other suite
    runs at the same time (one after the other, the first would wait in vain)."""
    return (f"import os, time\ndef test_meets():\n    open({str(here)!r}, 'w').close()\n"
            f"    end = time.monotonic() + 30\n"
            f"    while not os.path.exists({str(there)!r}):\n"
            f"        assert time.monotonic() < end, 'the other suite did not run meanwhile'\n"
            f"        time.sleep(0.05)\n")


def test_suites_run_side_by_side_and_the_last_line_sums_them(tmp_path: Path) -> None:
    a_mark, b_mark = tmp_path / "a.mark", tmp_path / "b.mark"
    a = _suite_dir(tmp_path, "a", _meet(a_mark, b_mark) + "def test_two():\n    pass\n")
    b = _suite_dir(tmp_path, "b", _meet(b_mark, a_mark) + "import pytest\n"
                                   "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n")
    proc = _run("--suite", "a", "--", *_pytest_args(a), "--suite", "b", "--", *_pytest_args(b))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[-1] == "3 passed, 0 failed, 1 skipped"
    assert any(line.startswith("[a] ") and "2 passed" in line for line in lines), proc.stdout
    assert any(line.startswith("[b] ") and "1 passed, 1 skipped" in line for line in lines), proc.stdout
    assert any("a: 2 passed, 0 failed, 0 skipped in" in line and str(a) in line for line in lines), proc.stdout


def test_a_failing_suite_fails_the_run_and_is_named(tmp_path: Path) -> None:
    good = _suite_dir(tmp_path, "good", "def test_ok():\n    pass\n")
    bad = _suite_dir(tmp_path, "bad", "def test_broken():\n    assert 1 == 2\n")
    proc = _run("--suite", "good", "--", *_pytest_args(good), "--suite", "bad", "--", *_pytest_args(bad))
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1] == "1 passed, 1 failed, 0 skipped"
    assert "bad: 0 passed, 1 failed, 0 skipped" in proc.stdout and "FAILED in pytest (exit 1)" in proc.stdout


def test_a_failed_prepare_step_skips_its_suite_and_fails_the_run(tmp_path: Path) -> None:
    folder = _suite_dir(tmp_path, "e2e", "def test_never():\n    pass\n")
    proc = _run("--suite", "e2e", "--prepare", "echo building; exit 3", "--nice", "5", "--", *_pytest_args(folder))
    assert proc.returncode == 1
    assert "[e2e] building" in proc.stdout
    assert "FAILED in prepare (echo building; exit 3)" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "0 passed, 0 failed, 0 skipped"


def test_the_prepare_step_runs_at_the_given_priority_before_pytest(tmp_path: Path) -> None:
    marker = tmp_path / "prepared"
    folder = _suite_dir(tmp_path, "e2e", f"def test_prepared():\n    assert open({str(marker)!r}).read() == '7'\n")
    prepare = f"python3 -c \"import os; open('{marker}', 'w').write(str(os.nice(0)))\""
    proc = _run("--suite", "e2e", "--prepare", prepare, "--nice", "7", "--", *_pytest_args(folder))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines()[-1] == "1 passed, 0 failed, 0 skipped"


def test_sigterm_ends_every_suite_and_still_sums(tmp_path: Path) -> None:
    slow = _suite_dir(tmp_path, "slow", "import time\ndef test_waits():\n    time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-P", str(SCRIPT), "--suite", "slow", "--", *_pytest_args(slow)],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)
    time.sleep(2.0)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert out.splitlines()[-1].endswith("failed, 0 skipped")
    assert "slow:" in out and "FAILED" in out


def test_a_suite_after_another_waits_for_its_prepare_step_only(tmp_path: Path) -> None:
    venv = tmp_path / "venv-made"
    first = _suite_dir(tmp_path, "first", "def test_ok():\n    pass\n")
    second = _suite_dir(tmp_path, "second", f"import os\ndef test_after():\n    assert os.path.exists({str(venv)!r})\n")
    proc = _run("--suite", "first", "--prepare", f"sleep 1; touch {venv}", "--", *_pytest_args(first),
                "--suite", "second", "--after", "first", "--", *_pytest_args(second))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines()[-1] == "2 passed, 0 failed, 0 skipped"


def test_a_suite_after_another_waits_for_its_first_prepare_step_only(tmp_path: Path) -> None:
    # The first step makes the venv; the second (lint, say) is still running when the other
    # suite's pytest starts: it ends only once that pytest has run.
    venv, started = tmp_path / "venv-made", tmp_path / "second-started"
    first = _suite_dir(tmp_path, "first", "def test_ok():\n    pass\n")
    second = _suite_dir(tmp_path, "second", f"import os\ndef test_after():\n    assert os.path.exists({str(venv)!r})\n"
                                            f"    open({str(started)!r}, 'w').close()\n")
    lint = f"for i in $(seq 300); do test -e {started} && exit 0; sleep 0.1; done; exit 5"
    proc = _run("--suite", "first", "--prepare", f"touch {venv}", "--prepare", lint, "--", *_pytest_args(first),
                "--suite", "second", "--after", "first", "--", *_pytest_args(second))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.splitlines()[-1] == "2 passed, 0 failed, 0 skipped"


def test_a_suite_after_a_failed_prepare_step_is_not_run(tmp_path: Path) -> None:
    first = _suite_dir(tmp_path, "first", "def test_ok():\n    pass\n")
    second = _suite_dir(tmp_path, "second", "def test_never():\n    pass\n")
    proc = _run("--suite", "first", "--prepare", "exit 2", "--", *_pytest_args(first),
                "--suite", "second", "--after", "first", "--", *_pytest_args(second))
    assert proc.returncode == 1
    assert "second: 0 passed, 0 failed, 0 skipped" in proc.stdout
    assert "not run: the prepare step of first failed" in proc.stdout


def test_after_must_name_another_suite(tmp_path: Path) -> None:
    folder = _suite_dir(tmp_path, "only", "def test_ok():\n    pass\n")
    proc = _run("--suite", "only", "--after", "nobody", "--", *_pytest_args(folder))
    assert proc.returncode != 0 and "not another suite" in proc.stderr
