"""Targets of issue 6 judged from one run, and the run written as JSON, a Markdown table and
a PNG plot (medians with min-max error bars)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from results import Series, Target, Workload

STRATA = ("strata-remote", "strata-fuse", "strata-sc")
BASE = "s3fs"
README_START = "<!-- results:start -->"
README_END = "<!-- results:end -->"


def _largest(workloads: list[Workload], prefix: str) -> Workload | None:
    found = [w for w in workloads if w.id.startswith(prefix)]
    return max(found, key=lambda w: w.bytes) if found else None


def _na(tid: str, text: str, why: str) -> Target:
    return Target(tid, text, "N/A", detail=why)


def _pair(w: Workload, a: str, pa: str, b: str, pb: str) -> tuple[Series, Series] | str:
    sa, sb = w.get(a, pa), w.get(b, pb)
    for name, s in ((a, sa), (b, sb)):
        if s is None:
            return f"{name} was not measured"
        if not s.ok:
            return f"{name}: {s.skipped or 'no times'}"
    assert sa is not None and sb is not None
    return sa, sb


def _verdict(ok: bool, *series: Series) -> str:
    """PASS only if the ratio holds and no read of these series failed (wrong bytes, errors)."""
    return "PASS" if ok and not any(s.failures for s in series) else "MISS"


def _failed(*series: Series) -> str:
    failed = [f"{s.contestant} {s.phase}: {len(s.failures)} failed reads" for s in series if s.failures]
    return ("; " + "; ".join(failed)) if failed else ""


def judge(workloads: list[Workload]) -> list[Target]:
    targets: list[Target] = []
    agg = _largest(workloads, "aggregate-")
    for x in STRATA:
        text = f"warm aggregation ({agg.id if agg else 'aggregate'}) >= 10x faster than direct s3fs: {x}"
        if agg is None:
            targets.append(_na(f"warm-10x/{x}", text, "aggregation not run"))
            continue
        pair = _pair(agg, x, "warm", BASE, "cold")
        if isinstance(pair, str):
            targets.append(_na(f"warm-10x/{x}", text, pair))
            continue
        sx, sb = pair
        ratio = sb.median / sx.median
        targets.append(Target(f"warm-10x/{x}", text, _verdict(ratio >= 10, sx), ratio, ">= 10",
                              f"s3fs median {sb.median:.3f} s, {x} warm median {sx.median:.3f} s" + _failed(sx)))
        spread_text = f"warm spread (max/min) of the aggregation under 1.2: {x}"
        targets.append(Target(f"warm-spread/{x}", spread_text, _verdict(sx.spread < 1.2, sx), sx.spread, "< 1.2",
                              f"{x} warm min {sx.min:.3f} s, max {sx.max:.3f} s"))
    for w in workloads:
        if not (w.id.startswith("aggregate-") or w.id.startswith("linecount-")):
            continue
        for x in STRATA:
            text = f"cold read at most 1.1x the time of direct s3fs ({w.id}): {x}"
            pair = _pair(w, x, "cold", BASE, "cold")
            if isinstance(pair, str):
                targets.append(_na(f"cold-1.1x/{w.id}/{x}", text, pair))
                continue
            sx, sb = pair
            ratio = sx.median / sb.median
            targets.append(Target(f"cold-1.1x/{w.id}/{x}", text, _verdict(ratio <= 1.1, sx), ratio, "<= 1.1",
                                  f"{x} cold median {sx.median:.3f} s, s3fs median {sb.median:.3f} s" + _failed(sx)))
    lines = _largest(workloads, "linecount-")
    for x, share in (("strata-fuse", 0.5), ("strata-sc", 0.8)):
        text = f"warm sequential read at least {share:.0%} of page-cache read speed: {x}"
        if lines is None:
            targets.append(_na(f"seq-speed/{x}", text, "line count not run"))
            continue
        pair = _pair(lines, x, "warm", "local", "warm")
        if isinstance(pair, str):
            targets.append(_na(f"seq-speed/{x}", text, pair))
            continue
        sx, sl = pair
        ratio = sl.median / sx.median
        targets.append(Target(f"seq-speed/{x}", text, _verdict(ratio >= share, sx), ratio, f">= {share}",
                              f"{lines.id}: {x} warm {lines.bytes / sx.median / 1e6:.0f} MB/s, "
                              f"page cache {lines.bytes / sl.median / 1e6:.0f} MB/s" + _failed(sx)))
    sharing = _largest(workloads, "sharing-")
    for x in STRATA:
        text = f"sharing: the fifth process reads warm, from the cache the first four filled: {x}"
        if sharing is None:
            targets.append(_na(f"sharing/{x}", text, "sharing not run"))
            continue
        fifth = sharing.get(x, "fifth")
        if fifth is None or not fifth.ok:
            targets.append(_na(f"sharing/{x}", text, fifth.skipped if fifth else f"{x} was not measured"))
            continue
        fetched = fifth.extra.get("store_bytes", [])
        four = sharing.get(x, next(s.phase for s in sharing.series if s.phase != "fifth"))
        four_bytes = four.extra.get("store_bytes", []) if four else []
        ok = bool(fetched) and max(fetched) == 0
        targets.append(Target(f"sharing/{x}", text, _verdict(ok, fifth), float(max(fetched) if fetched else -1),
                              "0 bytes from the store",
                              f"fifth: {max(fetched) if fetched else '?':,} bytes from the store (max over reps), median "
                              f"{fifth.median:.3f} s; the four together fetched {_mib(four_bytes)} per rep "
                              f"(dataset {sharing.bytes / 2**20:.0f} MiB)"))
    return targets


def _mib(values: list[float]) -> str:
    if not values:
        return "?"
    return "/".join(f"{v / 2**20:.0f}" for v in values) + " MiB"


# -- Markdown --------------------------------------------------------------------------------

def _cell(s: Series | None) -> str:
    if s is None:
        return ""
    if s.skipped:
        return "n/a"
    failed = f" **{len(s.failures)} failed**" if s.failures else ""
    if not s.ok:
        return failed.strip()
    return f"{s.median:.3f} ({s.min:.3f}–{s.max:.3f}){failed}"


def _phases(w: Workload) -> list[str]:
    seen: list[str] = []
    for s in w.series:
        if s.phase not in seen:
            seen.append(s.phase)
    return seen


def workload_table(w: Workload) -> list[str]:
    phases = _phases(w)
    base = {p: w.get(BASE, p) for p in phases}
    head = ["contestant"] + [f"{p}: median (min–max) s" for p in phases]
    if w.bytes and not w.id.startswith("sharing"):
        head += [f"{p} MB/s" for p in phases]
    head += [f"{p} vs s3fs" for p in phases if base[p] is not None and base[p].ok]  # type: ignore[union-attr]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    contestants: list[tuple[str, str]] = []
    for ws in w.series:
        if (ws.contestant, ws.label) not in contestants:
            contestants.append((ws.contestant, ws.label))
    notes: list[str] = []
    for cid, label in contestants:
        series = {p: w.get(cid, p) for p in phases}
        cells = [label] + [_cell(series[p]) for p in phases]
        if w.bytes and not w.id.startswith("sharing"):
            cells += [f"{w.bytes / s.median / 1e6:.0f}" if s is not None and s.ok else "" for s in series.values()]
        for p in phases:
            b = base[p]
            if b is None or not b.ok:
                continue
            sp = series[p]
            cells.append(f"{sp.median / b.median:.2f}x" if sp is not None and sp.ok else "")
        rows.append("| " + " | ".join(cells) + " |")
        for sv in series.values():
            if sv is None:
                continue
            s = sv
            for failure in s.failures:
                notes.append(f"{label}, {s.phase}: FAILED {failure}")
            if s.skipped and f"{label}: {s.skipped}" not in notes:
                notes.append(f"{label}: {s.skipped}")
            elif s.note and f"{label}: {s.note}" not in notes:
                notes.append(f"{label}: {s.note}")
            for key, values in s.extra.items():
                notes.append(f"{label}, {s.phase}: {key} = {_fmt_values(values)}")
    return rows + ([""] + [f"- {n}" for n in notes] if notes else [])


def _fmt_values(values: Any) -> str:
    def one(v: Any) -> str:
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        if isinstance(v, int):
            return f"{v:,}"
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    return ", ".join(one(v) for v in values) if isinstance(values, list) else one(values)


def targets_table(targets: list[Target]) -> list[str]:
    rows = ["| target | measured | needed | verdict | detail |", "|---|---|---|---|---|"]
    for t in targets:
        value = f"{t.value:.2f}" if t.value is not None and t.threshold != "0 bytes from the store" else (
            f"{t.value:,.0f} B" if t.value is not None else "")
        rows.append(f"| {t.text} | {value} | {t.threshold} | **{t.verdict}** | {t.detail} |")
    return rows


def markdown(run: dict[str, Any], workloads: list[Workload], targets: list[Target], png_name: str) -> str:
    net = run["network"]
    lines = [
        f"# Strata benchmark: {run['name']}",
        "",
        f"- started {run['started']}, took {run['duration_s'] / 60:.1f} min; {'quick run' if run['quick'] else 'full run'}, "
        f"{run['reps']} repetitions (interleaved)",
        f"- machine: {run['machine']['cpus']} CPUs, {run['machine']['memory_gib']:.0f} GiB; 1-minute load average "
        f"{run['machine']['load_start']:.1f} at the start, {run['machine']['load_end']:.1f} at the end "
        "(other jobs share this machine: compare ratios within this run, not absolute times across runs)",
        f"- store: moto S3 in network namespace over a veth pair ({net['mode']}), {net['rate_mbit']:g} Mbit/s "
        f"({net['shaped_by']}), {run['settings']['ttfb_ms']:g} ms time to first byte per request (delaying proxy in "
        "front of moto, inside the namespace)" if net["mode"] == "netns" else
        f"- store: LOOPBACK FALLBACK ({net['reason']}): moto on 127.0.0.1 behind the delaying proxy, which also caps "
        f"the rate at {net['rate_mbit']:g} Mbit/s; {run['settings']['ttfb_ms']:g} ms time to first byte",
        f"- Strata: one master, one worker (MEM tier {run['settings']['mem_quota']}, blocks {run['settings']['block_size']}, "
        f"readahead {run['settings']['readahead_blocks']} blocks)",
        f"- link check: {run.get('link_check', '')}",
        "",
        "## Targets",
        "",
        *targets_table(targets),
        "",
        f"![results]({png_name})",
        "",
    ]
    for w in workloads:
        lines += [f"## {w.title}", "", f"{w.description}. Load average {w.load[0]:.1f} → {w.load[1]:.1f}.", "",
                  *workload_table(w), ""]
    return "\n".join(lines)


# -- plot ------------------------------------------------------------------------------------

def plot(workloads: list[Workload], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [w for w in workloads if any(s.ok for s in w.series)]
    if not shown:
        return
    cols = 2
    rows = (len(shown) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(16, 4.8 * rows), squeeze=False)
    colors = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3"]
    for ax, w in zip(axes.flat, shown):
        phases = _phases(w)
        contestants: list[tuple[str, str]] = []
        for ws in w.series:
            if (ws.contestant, ws.label) not in contestants and (ws.ok or ws.skipped):
                contestants.append((ws.contestant, ws.label))
        width = 0.8 / max(1, len(phases))
        for i, phase in enumerate(phases):
            xs, ys, lo, hi = [], [], [], []
            for j, (cid, _) in enumerate(contestants):
                found = w.get(cid, phase)
                if found is None or not found.ok:
                    continue
                xs.append(j + (i - (len(phases) - 1) / 2) * width)
                ys.append(found.median)
                lo.append(found.median - found.min)
                hi.append(found.max - found.median)
            ax.bar(xs, ys, width, yerr=[lo, hi], capsize=3, label=phase, color=colors[i % len(colors)])
        for j, (cid, _) in enumerate(contestants):
            if all((found := w.get(cid, p)) is None or not found.ok for p in phases):
                ax.text(j, 0.5, "n/a", ha="center", transform=ax.get_xaxis_transform(), color="gray")
        ax.set_xticks(range(len(contestants)))
        ax.set_xticklabels([c for c, _ in contestants], rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("seconds (log), median, bars min–max")
        ax.set_title(w.title, fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", which="both", alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# -- files -----------------------------------------------------------------------------------

def write(out: Path, name: str, run: dict[str, Any], workloads: list[Workload], targets: list[Target]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{name}.json", "md": out / f"{name}.md", "png": out / f"{name}.png"}
    data = {**run, "workloads": [w.to_json() for w in workloads], "targets": [t.to_json() for t in targets]}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")
    paths["md"].write_text(markdown(run, workloads, targets, paths["png"].name) + "\n")
    plot(workloads, paths["png"], f"Strata benchmark {name} ({run['started'][:10]})")
    return paths


def update_readme(readme: Path, name: str, run: dict[str, Any], targets: list[Target]) -> None:
    """Replace the results section of bench/README.md with this run's targets."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        return
    passed = sum(t.verdict == "PASS" for t in targets)
    missed = sum(t.verdict == "MISS" for t in targets)
    section = "\n".join([
        README_START,
        f"From `results/{name}.md` ({'quick' if run['quick'] else 'full'} run of {run['started'][:10]}, "
        f"{run['reps']} repetitions, network {run['network']['mode']}, load average "
        f"{run['machine']['load_start']:.1f}–{run['machine']['load_end']:.1f}): {passed} targets PASS, {missed} MISS.",
        "",
        *targets_table(targets),
        "",
        f"![results](results/{name}.png)",
        "",
        f"Every workload's table (cold and warm, min/median/max per contestant): [results/{name}.md](results/{name}.md).",
        README_END,
    ])
    pattern = re.compile(re.escape(README_START) + ".*?" + re.escape(README_END), re.S)
    readme.write_text(pattern.sub(lambda _: section, text))
