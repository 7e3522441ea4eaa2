"""Targets of issues 6 and 15 judged from one run, and the run written as JSON, a Markdown table and
a PNG plot (medians with min-max error bars)."""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from results import Series, Target, Workload  # noqa: E402

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


def _ratio(tid: str, text: str, w: Workload | None, x: str, px: str, other: str, po: str,
           ratio_of: Callable[[Series, Series], float], passes: Callable[[float], bool], threshold: str,
           detail: Callable[[Series, Series], str]) -> Target:
    """A target on the ratio of two series of one workload (N/A when either is missing)."""
    if w is None:
        return _na(tid, text, "workload not run")
    pair = _pair(w, x, px, other, po)
    if isinstance(pair, str):
        return _na(tid, text, pair)
    sx, so = pair
    ratio = ratio_of(sx, so)
    return Target(tid, text, _verdict(passes(ratio), sx), ratio, threshold, detail(sx, so) + _failed(sx))


def _noise(w: Workload | None) -> str:
    """The spread of the page-cache read in the same workload: what the machine's load alone does."""
    local = w.get("local", "warm") if w is not None else None
    return f"; local page-cache read spread {local.spread:.2f} in the same run" if local is not None and local.ok else ""


def _at_least(share: float) -> Callable[[float], bool]:
    return lambda ratio: ratio >= share


def judge(workloads: list[Workload], rate_mbit: float = 1000.0) -> list[Target]:
    """The targets of issue 6, then those of issues 15, 27 and 28."""
    return judge_issue6(workloads) + judge_issue15(workloads, rate_mbit) + judge_issue27(workloads) + judge_issue28(workloads)


def judge_issue6(workloads: list[Workload]) -> list[Target]:
    targets: list[Target] = []
    agg = _largest(workloads, "aggregate-")
    for x in STRATA:
        targets.append(_ratio(
            f"warm-10x/{x}", f"warm aggregation ({agg.id if agg else 'aggregate'}) >= 10x faster than direct s3fs: {x}",
            agg, x, "warm", BASE, "cold", lambda sx, sb: sb.median / sx.median, lambda r: r >= 10, ">= 10",
            lambda sx, sb: f"s3fs median {sb.median:.3f} s, warm median {sx.median:.3f} s"))
        targets.append(_ratio(
            f"warm-spread/{x}", f"warm spread (max/min) of the aggregation under 1.2: {x}",
            agg, x, "warm", x, "warm", lambda sx, _: sx.spread, lambda r: r < 1.2, "< 1.2",
            lambda sx, _: f"warm min {sx.min:.3f} s, max {sx.max:.3f} s" + _noise(agg)))
    for w in workloads:
        if not (w.id.startswith("aggregate-") or w.id.startswith("linecount-")):
            continue
        for x in STRATA:
            targets.append(_ratio(
                f"cold-1.1x/{w.id}/{x}", f"cold read at most 1.1x the time of direct s3fs ({w.id}): {x}",
                w, x, "cold", BASE, "cold", lambda sx, sb: sx.median / sb.median, lambda r: r <= 1.1, "<= 1.1",
                lambda sx, sb: f"cold median {sx.median:.3f} s, s3fs median {sb.median:.3f} s"))
    lines = _largest(workloads, "linecount-")
    for x, share in (("strata-fuse", 0.5), ("strata-sc", 0.8)):
        size = lines.bytes if lines else 0
        targets.append(_ratio(
            f"seq-speed/{x}", f"warm sequential read at least {share:.0%} of page-cache read speed: {x}",
            lines, x, "warm", "local", "warm", lambda sx, sl: sl.median / sx.median,
            _at_least(share), f">= {share}",
            lambda sx, sl: f"{lines.id if lines else ''}: warm {size / sx.median / 1e6:.0f} MB/s, page cache {size / sl.median / 1e6:.0f} MB/s"))
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
    nodes = _largest(workloads, "nodes-sharing-")
    text = "sharing across workers: readers on every worker's node read a preloaded dataset with 0 bytes from the store"
    series = nodes.series[0] if nodes and nodes.series else None
    if nodes is None or series is None or not series.ok:
        targets.append(_na("sharing-nodes/strata-sc", text, "not run" if series is None else series.skipped or "failed"))
    else:
        fetched, copied = series.extra.get("store_bytes", []), series.extra.get("peer_bytes", [])
        targets.append(Target("sharing-nodes/strata-sc", text, _verdict(bool(fetched) and max(fetched) == 0, series),
                              float(max(fetched) if fetched else -1), "0 bytes from the store",
                              f"{series.phase}: {max(fetched) if fetched else '?':,.0f} bytes from the store (max over "
                              f"reps), {_mib(copied)} copied between workers per rep (dataset "
                              f"{nodes.bytes / 2**20:.0f} MiB), median {series.median:.3f} s"))
    return targets


# Issue 15: every warm path near the page cache (the remote path near loopback TCP), warm
# spread near the page cache's, cold reads near the link's limit, one worker serving many.
PAGE_CACHE_SHARE = 0.9
LOOPBACK_SHARE = 0.8
SPREAD_MARGIN = 0.1
LINK_SHARE = 0.9
MANY_READERS_SHARE = 0.7
LOCAL_PATHS = ("strata-fuse", "strata-sc")  # paths on the worker's node, judged against the page cache


def judge_issue15(workloads: list[Workload], rate_mbit: float) -> list[Target]:
    targets: list[Target] = []
    warm_workloads = [w for w in workloads if w.id.split("-")[0] in ("aggregate", "linecount", "training", "spill")]
    for w in warm_workloads:
        for x in LOCAL_PATHS:
            targets.append(_ratio(
                f"i15-warm-page-cache/{w.id}/{x}", f"warm read at least {PAGE_CACHE_SHARE:.0%} of the page cache's speed "
                f"({w.id}): {x}", w, x, "warm", "local", "warm", lambda sx, sl: sl.median / sx.median,
                _at_least(PAGE_CACHE_SHARE), f">= {PAGE_CACHE_SHARE}",
                lambda sx, sl: f"warm median {sx.median:.3f} s, page cache {sl.median:.3f} s"))
        if w.id.startswith("linecount-"):
            targets.append(_ratio(
                f"i15-warm-loopback/{w.id}/strata-remote", f"remote warm read at least {LOOPBACK_SHARE:.0%} of a loopback "
                f"TCP read from another process ({w.id}): strata-remote", w, "strata-remote", "warm", "loopback-tcp",
                "warm", lambda sx, st: st.median / sx.median, _at_least(LOOPBACK_SHARE), f">= {LOOPBACK_SHARE}",
                lambda sx, st: f"warm median {sx.median:.3f} s, loopback TCP {st.median:.3f} s"))
        if w.id.startswith(("aggregate-", "linecount-")):
            for x in STRATA:
                targets.append(_ratio(
                    f"i15-warm-spread/{w.id}/{x}", f"warm spread within {SPREAD_MARGIN} of the page cache's ({w.id}): {x}",
                    w, x, "warm", "local", "warm", lambda sx, sl: sx.spread - sl.spread,
                    lambda r: r <= SPREAD_MARGIN, f"<= +{SPREAD_MARGIN}",
                    lambda sx, sl: f"spread {sx.spread:.2f}, page cache {sl.spread:.2f}"))
    link_bytes_per_s = rate_mbit * 1e6 / 8
    for w in workloads:
        if not w.id.startswith(("aggregate-", "linecount-", "spill-")):
            continue
        limit = w.bytes / link_bytes_per_s
        for x in STRATA:
            targets.append(_ratio(
                f"i15-cold-link/{w.id}/{x}", f"cold read at least {LINK_SHARE:.0%} of the link's limit "
                f"({rate_mbit:g} Mbit/s, {limit:.2f} s) and no slower than direct s3fs ({w.id}): {x}",
                w, x, "cold", BASE, "cold", lambda sx, sb: limit / sx.median,
                _at_least(LINK_SHARE), f">= {LINK_SHARE}",
                lambda sx, sb: f"cold median {sx.median:.3f} s ({w.bytes / sx.median / 1e6:.0f} MB/s), s3fs "
                               f"{sb.median:.3f} s" + ("" if sx.median <= sb.median else "; SLOWER than s3fs")))
            last = targets[-1]
            pair = _pair(w, x, "cold", BASE, "cold")
            if last.verdict == "PASS" and not isinstance(pair, str) and pair[0].median > pair[1].median:
                last.verdict = "MISS"
    for w in workloads:
        if w.id.startswith("spill-"):
            for x in STRATA:
                s = w.get(x, "warm")
                text = f"spill: the warm read of a dataset twice the MEM tier reads nothing from the store: {x}"
                if s is None or not s.ok:
                    targets.append(_na(f"i15-spill-store/{x}", text, s.skipped if s else f"{x} was not measured"))
                    continue
                fetched = s.extra.get("store_bytes", [])
                ratios = [r for r in s.extra.get("hit_ratio", []) if r is not None]
                targets.append(Target(
                    f"i15-spill-store/{x}", text, _verdict(bool(fetched) and max(fetched) == 0, s),
                    float(max(fetched) if fetched else -1), "0 bytes from the store",
                    f"warm: {max(fetched) if fetched else '?':,.0f} bytes from the store (max over reps); worker hit "
                    f"ratio {min(ratios) if ratios else float('nan'):.2f}; MEM tier {w.extra.get('mem_quota', 0) / 2**20:.0f} MiB"))
        if w.id.startswith("readers-"):
            for phase in _phases(w):
                targets.append(_ratio(
                    f"i15-many-readers/{w.id}/{phase}", f"one worker serving {phase} at once: at least "
                    f"{MANY_READERS_SHARE:.0%} of the loopback TCP limit", w, "strata-remote", phase, "loopback-tcp", phase,
                    lambda sx, st: st.median / sx.median, _at_least(MANY_READERS_SHARE), f">= {MANY_READERS_SHARE}",
                    lambda sx, st: f"{w.bytes * _count(sx.phase) / sx.median / 1e6:.0f} MB/s in all, loopback "
                                   f"{w.bytes * _count(sx.phase) / st.median / 1e6:.0f} MB/s; CPU s/GiB: readers "
                                   f"{_median(sx.extra.get('client_cpu_s_per_gib'))} (loopback "
                                   f"{_median(st.extra.get('client_cpu_s_per_gib'))}), worker "
                                   f"{_median(sx.extra.get('server_cpu_s_per_gib'))} (sender "
                                   f"{_median(st.extra.get('server_cpu_s_per_gib'))})"))
    return targets


# Issue 27's targets (set at 1,000,000 files; judged at whatever size was run).
FILES_PER_S = 50_000          # whole listings through the client and through FUSE
STATS_PER_S = 50_000          # warm stats by 4 processes on one node
MASTER_CPU_PER_STAT_US = 50.0
BYTES_PER_FILE = 200.0        # the master's resident memory per mounted file
HEALTHZ_S = 1.0               # the slowest /healthz answer while the tree is walked
REQUEST_S = 1.0               # mount add and report: no walk on the request's path


def judge_issue27(workloads: list[Workload]) -> list[Target]:
    """The many-files workload's lines: each its value, the issue's target, PASS/MISS."""
    targets: list[Target] = []
    for w in workloads:
        if w.id.startswith("manyfiles-"):
            targets += _many_files_targets(w)
    return targets


# Issue 28, target 2: the fsspec client's warm training reads at least as fast as fsspec's
# simplecache (a copy on the reader's local disk), on the worker's node and on another host.
FSSPEC_CLIENT_PATHS = ("strata-remote", "strata-sc")
# Every path a training job may read through (the remote one with and without a near cache).
TRAINING_PATHS = ("strata-remote", "strata-remote-direct", "strata-fuse", "strata-sc")


def judge_issue28(workloads: list[Workload]) -> list[Target]:
    targets: list[Target] = []
    for w in workloads:
        if not w.id.startswith("training-"):
            continue
        for x in FSSPEC_CLIENT_PATHS:
            targets.append(_ratio(
                f"i28-warm-simplecache/{w.id}/{x}", f"warm training reads at least as fast as fsspec simplecache "
                f"({w.id}): {x}", w, x, "warm", "simplecache", "warm", lambda sx, sc: sc.median / sx.median,
                _at_least(1.0), ">= 1.0", lambda sx, sc: f"warm median {sx.median:.3f} s, simplecache {sc.median:.3f} s"))
        for x in TRAINING_PATHS:
            targets.append(_ratio(
                f"i28-cold-s3fs/{w.id}/{x}", f"cold training reads at least twice as fast as s3fs ({w.id}): {x}",
                w, x, "cold", "s3fs", "cold", lambda sx, s3: s3.median / sx.median,
                _at_least(2.0), ">= 2.0", lambda sx, s3: f"cold median {sx.median:.1f} s, s3fs {s3.median:.1f} s"))
    return targets


def _per_s(s: Series | None, unit: str) -> float | None:
    values = s.extra.get(f"{unit}_per_s") if s is not None and s.ok else None
    return float(statistics.median(values)) if values else None


def _many_files_targets(w: Workload) -> list[Target]:
    n = w.extra.get("files", 0)
    at = f" ({n:,} files)"
    targets: list[Target] = []
    local_list, local_stat = _per_s(w.get("local", "list"), "files"), _per_s(w.get("local", "stat"), "stats")
    for cid, phase, unit, needed, local, what in (
            ("strata-client", "list", "files", FILES_PER_S, local_list, "whole listing (find) through the fsspec client"),
            ("strata-fuse", "list", "files", FILES_PER_S, local_list, "whole listing (find) through FUSE"),
            ("namespace", "list", "files", FILES_PER_S, local_list, "whole listing by the master's namespace alone"),
            ("strata-sc", "stat", "stats", STATS_PER_S, local_stat, "warm stats, 4 new processes on the node, fsspec"),
            ("strata-fuse", "stat", "stats", STATS_PER_S, local_stat, "warm stats, 4 new processes, through FUSE")):
        text = f"issue 27: {what}{at}"
        s = w.get(cid, phase)
        value = _per_s(s, unit)
        if s is not None and value is None and s.failures:
            targets.append(Target(f"i27-{phase}/{cid}", text, "MISS", None, f">= {needed:,} {unit}/s",
                                  "every pass failed: " + "; ".join(s.failures)))
            continue
        if s is None or value is None:
            targets.append(_na(f"i27-{phase}/{cid}", text, (s.skipped if s else "") or w.extra.get("failed", "not measured")))
            continue
        detail = f"{unit}/s per pass {_fmt_values(s.extra[f'{unit}_per_s'])}"
        if local:
            detail += f"; local disk {local:,.0f} {unit}/s ({value / local:.2f}x)"
        if "rss_growth" in s.extra:
            detail += (f"; the client process grew by {max(s.extra['rss_growth']) / 2**20:.0f} MiB "
                       f"(peak {max(s.extra['max_rss']) / 2**20:.0f} MiB)")
        if "first_walk_files_per_s" in s.extra:
            detail += f"; a new namespace's first walk (of the store) {s.extra['first_walk_files_per_s'][0]:,} files/s"
        if "master_get_status" in s.extra:
            detail += (f"; master {s.extra['master_cpu_us_per_stat'][0]:.1f} us CPU per stat, "
                       f"{s.extra['master_get_status'][0]:,} GetStatus")
        targets.append(Target(f"i27-{phase}/{cid}", text, _verdict(value >= needed, s), value, f">= {needed:,} {unit}/s",
                              detail + _failed(s)))
    if "failed" in w.extra:
        targets.append(Target("i27-run", f"issue 27: the many-files workload ran{at}", "MISS", None, "no failure",
                              w.extra["failed"]))
        return targets
    stats = w.extra.get("stat_files", 0)
    for cid in ("strata-sc", "strata-fuse"):
        text = f"issue 27: master CPU per stat that reaches it, {cid}{at}"
        if f"{cid}_master_cpu_s" not in w.extra:
            targets.append(_na(f"i27-master-cpu/{cid}", text, "not measured"))
            continue
        cpu, reached = w.extra[f"{cid}_master_cpu_s"], w.extra[f"{cid}_master_get_status"]
        per = cpu / reached * 1e6 if reached else cpu / max(1, stats) * 1e6
        targets.append(Target(f"i27-master-cpu/{cid}", text, "PASS" if per <= MASTER_CPU_PER_STAT_US else "MISS", per,
                              f"<= {MASTER_CPU_PER_STAT_US:g} us",
                              f"master {cpu:.2f} CPU s during {stats:,} stats beyond its "
                              f"{w.extra['master_idle_cpu_per_s']:.3f} CPU s/s at rest, {reached:,.0f} of them reached "
                              "it as GetStatus" + ("" if reached else " (none: per stat of all)")))
    for step in ("mount", "find"):
        per = w.extra[f"bytes_per_file_after_{step}"]
        others = ", ".join(f"{k}: {w.extra[f'bytes_per_file_after_{k}']:.0f}" for k in ("mount", "find", "stats", "report"))
        targets.append(Target(f"i27-memory/{step}", f"issue 27: master resident memory per file after the {step}{at}",
                              "PASS" if per <= BYTES_PER_FILE else "MISS", per, f"<= {BYTES_PER_FILE:g} B",
                              f"VmRSS {w.extra['rss_before'] / 2**20:.0f} MiB before the mount, "
                              f"{w.extra[f'rss_after_{step}'] / 2**20:.0f} MiB after; B/file after {others} "
                              "(the master exposes no tracemalloc: RSS, allocator slack included)"))
    slowest, failed = w.extra["health_slowest_s"], w.extra["health_failed"]
    targets.append(Target("i27-healthz", f"issue 27: /healthz answers within {HEALTHZ_S:g} s while the tree is mounted, "
                          f"walked, stat'ed and reported{at}", "PASS" if slowest <= HEALTHZ_S and not failed else "MISS",
                          slowest, f"<= {HEALTHZ_S:g} s, none failed",
                          f"slowest of {w.extra['health_probes']:,} probes (every 50 ms); {failed} failed"
                          + (f": {'; '.join(w.extra['health_failures'])}" if failed else "")))
    for key, what in (("mount_add_s", "`mount add`"), ("report_s", "a report right after the mount")):
        value = w.extra[key]
        extra = (f"; the report totalled the {n:,} files within {w.extra['totals_wait_s']:g} s: {w.extra['report_totalled']}"
                 if key == "report_s" else "")
        targets.append(Target(f"i27-latency/{key}", f"issue 27: {what} answers with no walk on its path{at}",
                              "PASS" if value <= REQUEST_S else "MISS", value, f"<= {REQUEST_S:g} s",
                              f"{value:.3f} s{extra}"))
    dropped, stale = w.extra["workers_dropped"], w.extra["stale_answers"]
    targets.append(Target("i27-workers", f"issue 27: no worker dropped meanwhile{at}", "PASS" if dropped == 0 else "MISS",
                          float(dropped), "0 workers", f"{dropped} workers dropped from placement"))
    targets.append(Target("i27-stale", f"issue 27: no answer served stale from a healthy store{at}",
                          "PASS" if stale == 0 else "MISS", float(stale), "0 answers",
                          f"{stale:.0f} answers from metadata older than the sync interval"))
    return targets


def _count(phase: str) -> int:
    return int(phase.split()[0])


def _median(values: list[float] | None) -> str:
    return f"{statistics.median(values):.2f}" if values else "?"


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
    if w.bytes and not w.id.startswith(("sharing", "readers")):
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
        if w.bytes and not w.id.startswith(("sharing", "readers")):
            cells += [f"{w.bytes / s.median / 1e6:.0f}" if s is not None and s.ok else "" for s in series.values()]
        for p in phases:
            b = base[p]
            if b is None or not b.ok:
                continue
            sp = series[p]
            cells.append(f"{sp.median / b.median:.2f}x" if sp is not None and sp.ok else "")
        rows.append("| " + " | ".join(cells) + " |")
        for found in series.values():
            if found is not None:
                notes += [n for n in _notes(label, found) if n not in notes]
    return rows + ([""] + [f"- {n}" for n in notes] if notes else [])


def _notes(label: str, s: Series) -> list[str]:
    notes = [f"{label}, {s.phase}: FAILED {failure}" for failure in s.failures]
    if s.skipped or s.note:
        notes.append(f"{label}: {s.skipped or s.note}")
    notes += [f"{label}, {s.phase}: {key} = {_fmt_values(values)}" for key, values in s.extra.items()]
    return notes


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
        value = (f"{t.value:,.0f}" if abs(t.value) >= 1000 else f"{t.value:.3f}") if (
            t.value is not None and t.threshold != "0 bytes from the store") else (
            f"{t.value:,.0f} B" if t.value is not None else "")
        rows.append(f"| {t.text} | {value} | {t.threshold} | **{t.verdict}** | {t.detail} |")
    return rows


def markdown(run: dict[str, Any], workloads: list[Workload], targets: list[Target], png_name: str) -> str:
    net = run["network"]
    lines = [
        f"# Strata benchmark: {run['name']}",
        "",
        f"- started {run['started']}, took {run['duration_s'] / 60:.1f} min; {'quick run' if run['quick'] else 'full run'}, "
        f"{run['reps']} repetitions (interleaved; cold reads of datasets of 1 GiB or more: "
        f"{run.get('big_cold_reps', run['reps'])})",
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
        cold_reps = w.extra.get("cold_repetitions")
        reps = f" Cold reads: {cold_reps} repetitions (warm: {run['reps']})." if cold_reps else ""
        lines += [f"## {w.title}", "", f"{w.description}. Load average {w.load[0]:.1f} → {w.load[1]:.1f}.{reps}", "",
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


def update_readme(readme: Path, name: str, run: dict[str, Any], targets: list[Target],
                  workloads: Sequence[Workload] = ()) -> None:
    """Replace the results section of bench/README.md with this run's targets."""
    text = readme.read_text()
    if README_START not in text or README_END not in text:
        return
    peak = max([run["machine"]["load_start"], run["machine"]["load_end"], *(x for w in workloads for x in w.load)])
    passed = sum(t.verdict == "PASS" for t in targets)
    missed = sum(t.verdict == "MISS" for t in targets)
    section = "\n".join([
        README_START,
        f"From `results/{name}.md` ({'quick' if run['quick'] else 'full'} run of {run['started'][:10]}, "
        f"{run['reps']} repetitions, network {run['network']['mode']}, 1-minute load average "
        f"{run['machine']['load_start']:.1f} at the start, up to {peak:.1f} between workloads, "
        f"{run['machine']['load_end']:.1f} at the end): {passed} targets PASS, {missed} MISS.",
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


def load(path: Path) -> tuple[dict[str, Any], list[Workload]]:
    """A run and its workloads back from a results JSON file."""
    data = json.loads(path.read_text())
    fields = ("contestant", "label", "phase", "times", "note", "skipped", "failures", "extra")
    workloads = []
    for w in data.pop("workloads"):
        series = [Series(**{k: s[k] for k in fields if k in s}) for s in w["series"]]
        workloads.append(Workload(w["id"], w["title"], w["description"], w["bytes"], series, w.get("extra", {}),
                                  tuple(w.get("load_average", (0.0, 0.0)))))
    data.pop("targets", None)
    return data, workloads


if __name__ == "__main__":
    # Re-judge and re-render a run: python -P bench/report.py bench/results/full.json [--readme]
    source = Path(sys.argv[1])
    run, loaded = load(source)
    judged = judge(loaded)
    written = write(source.parent, source.stem, run, loaded, judged)
    if "--readme" in sys.argv[2:]:
        update_readme(Path(__file__).resolve().parent / "README.md", source.stem, run, judged, loaded)
    print("wrote " + ", ".join(str(p) for p in written.values()))
