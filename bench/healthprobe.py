"""Asks a URL (a server's /healthz) every 50 ms until a file appears, in a process of its own:
a listing of millions of files in the asking process holds its interpreter lock, and a probe
there would time that process, not the server.

    python -P bench/healthprobe.py http://127.0.0.1:8081/healthz /tmp/stop-file

Prints one line per failed request ("failed: ..."), then last "PROBES SLOWEST" (how many
requests, and the slowest answer's seconds, failures included).
"""

from __future__ import annotations

import os
import sys
import time
import urllib.request

INTERVAL = 0.05
TIMEOUT = 10.0


def main() -> None:
    url, stop = sys.argv[1], sys.argv[2]
    slowest, probes = 0.0, 0
    while not os.path.exists(stop):
        started = time.monotonic()
        try:
            with urllib.request.urlopen(url, timeout=TIMEOUT) as answer:
                answer.read()
        except OSError as exc:
            print("failed:", exc, flush=True)
        slowest = max(slowest, time.monotonic() - started)
        probes += 1
        time.sleep(INTERVAL)
    print(probes, slowest, flush=True)


if __name__ == "__main__":
    main()
