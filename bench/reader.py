"""One reader process of the sharing workload.

    python -P bench/reader.py '{"access": {...}, "op": "aggregate", "paths": [...]}'

It builds its filesystem, prints READY, waits for a line on stdin (so several readers start
together and their import time is not measured), runs the operation and prints one JSON
line: {"seconds": ..., "cpu": ..., "result": ..., "max_rss": ..., "rss_at_start": ...} (one per run with "repeat":
N; "full_paths" instead of "paths" gives paths not under the access's root; "cpu" is the CPU
seconds of this process, all threads, during the run; "max_rss" the most bytes it ever held
resident, "rss_at_start" those it held when the run began). A run that raises prints
{"error": "..."} and the process exits. `@FILE` in place of the JSON reads it from FILE (a
job naming thousands of files is longer than an argument may be).
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from contestants import Access, close_filesystem, open_filesystem  # noqa: E402
from ops import run_op  # noqa: E402


def main() -> None:
    given = sys.argv[1]
    job = json.loads(Path(given[1:]).read_text() if given.startswith("@") else given)
    access = Access.from_json(job["access"])
    fs = open_filesystem(access)
    print("READY", flush=True)
    sys.stdin.readline()
    paths = job.get("full_paths") or [access.path(p) for p in job["paths"]]
    for _ in range(int(job.get("repeat", 1))):
        resident = int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize()
        start, cpu = time.perf_counter(), time.process_time()
        try:
            result = run_op(job["op"], fs, paths)
        except Exception as exc:  # noqa: BLE001 - the benchmark records what failed
            print(json.dumps({"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"[:400]}), flush=True)
            raise
        seconds = time.perf_counter() - start
        max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        print(json.dumps({"seconds": seconds, "cpu": time.process_time() - cpu, "result": result, "max_rss": max_rss,
                          "rss_at_start": resident}),
              flush=True)
    if fs is not None:
        close_filesystem(fs)


if __name__ == "__main__":
    main()
