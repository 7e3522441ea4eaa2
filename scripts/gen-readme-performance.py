"""Fill the Performance section of README.md from the benchmark results in bench/results/.

    .venv/bin/python -P scripts/gen-readme-performance.py          # rewrite the section
    .venv/bin/python -P scripts/gen-readme-performance.py --check  # exit 1 if it is stale

bench/run.py writes bench/results/<name>.json and <name>.md. The section shows the newest
committed full run (else the newest quick run; a run of some workloads only, `--only`, is
neither): its settings and its table of targets, with
a link to every workload's table. tests/unit/test_docs.py fails when the section is stale.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RESULTS = REPO / "bench" / "results"
START = "<!-- performance:start (scripts/gen-readme-performance.py fills this) -->"
END = "<!-- performance:end -->"


def newest_result(folder: Path = RESULTS) -> Path | None:
    """The Markdown file of the newest full run, else of the newest quick run. Only results
    committed to git count (where git knows the folder): the README describes what a clone has."""
    tracked = _tracked(folder)
    runs = []
    for data in folder.glob("*.json"):
        md = data.with_suffix(".md")
        if tracked is not None and not {data, md} <= tracked:
            continue
        try:
            run = json.loads(data.read_text())
        except (OSError, ValueError):
            continue
        if md.is_file() and not run.get("partial", False):  # a run of some workloads only is no run to show
            runs.append((not run.get("quick", True), str(run.get("started", "")), md))
    return max(runs)[2] if runs else None


def _tracked(folder: Path) -> set[Path] | None:
    """Files under `folder` that git tracks; None when `folder` is not in a git work tree."""
    try:
        result = subprocess.run(["git", "-C", str(folder.parent), "ls-files", "-z", "--", folder.name],
                                capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return {folder.parent / name for name in result.stdout.decode().split("\0") if name}


def section(result: Path | None) -> str:
    """The text between the markers."""
    if result is None:
        return "No benchmark results in `bench/results/` yet: see [bench/README.md](bench/README.md) to run them."
    lines = result.read_text().splitlines()
    settings = [ln for ln in _until_heading(lines, 1) if ln.startswith("- ")]
    targets = [ln for ln in _section(lines, "## Targets") if ln.startswith("|")]
    rel = result.relative_to(REPO).as_posix()
    out = [f"From [`{rel}`]({rel}) (written by `bench/run.py`):", "", *settings, ""]
    if targets:
        out += [*targets, ""]
    out.append(f"Every workload's table, cold and warm, per contestant: [`{rel}`]({rel}); how the store is "
               "made to behave like a remote one: [bench/README.md](bench/README.md).")
    return "\n".join(out)


def _until_heading(lines: list[str], skip: int) -> list[str]:
    """Lines after the first `skip` headings, up to the next heading."""
    seen, out = 0, []
    for line in lines:
        if line.startswith("#"):
            seen += 1
            if seen > skip:
                break
            continue
        if seen == skip:
            out.append(line)
    return out


def _section(lines: list[str], heading: str) -> list[str]:
    if heading not in lines:
        return []
    rest = lines[lines.index(heading) + 1:]
    end = next((i for i, ln in enumerate(rest) if ln.startswith("## ")), len(rest))
    return rest[:end]


def render(readme: str, result: Path | None) -> str:
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        raise SystemExit(f"README.md has no performance markers ({START} ... {END})")
    return pattern.sub(lambda _: f"{START}\n{section(result)}\n{END}", readme)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if the section is stale")
    args = parser.parse_args(argv)
    current = README.read_text()
    text = render(current, newest_result())
    if args.check:
        if text != current:
            print("README.md's Performance section is stale: run .venv/bin/python -P scripts/gen-readme-performance.py",
                  file=sys.stderr)
            return 1
        return 0
    README.write_text(text)
    print("updated the Performance section of README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
