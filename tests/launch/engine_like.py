"""A process tree shaped like an engine's, at its worst, for the stop tests.

    python engine_like.py PIDS_FILE [MODE]

It starts two helpers that ignore SIGTERM (so only SIGKILL ends them), one a child and one
orphaned in a process group of its own (so a signal to the leader's group misses it), writes
``{"leader": pid, "helpers": [...]}`` to PIDS_FILE, then, by MODE: ``serve`` (default) waits
with Python's default signal handling, so SIGTERM ends the leader at once and leaves the helpers
behind, as vLLM's API server was left behind; ``deaf`` ignores SIGTERM and SIGINT too; ``crash``
exits with status 3 at once. :func:`start_helpers` is what the SGLang stub server uses too.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

STUBBORN = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); "
            "time.sleep(3600)")
# a child that starts a stubborn grandchild in a process group of its own, then exits (orphaning it)
ESCAPE = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', sys.argv[1]], process_group=0, "
          "stdout=subprocess.PIPE, stderr=subprocess.DEVNULL); p.stdout.readline(); print(p.pid)")


def start_helpers() -> list[int]:
    """Start both helpers; returns their pids once each has set its SIGTERM handler."""
    stubborn = subprocess.Popen([sys.executable, "-c", STUBBORN], stdout=subprocess.PIPE)
    stubborn.stdout.readline()  # type: ignore[union-attr]
    escape = subprocess.run([sys.executable, "-c", ESCAPE, STUBBORN], capture_output=True, text=True, check=True)
    return [stubborn.pid, int(escape.stdout)]


def main(argv: list[str]) -> int:
    import os

    pids_file, mode = argv[0], (argv[1] if len(argv) > 1 else "serve")
    helpers = start_helpers()
    if mode == "deaf":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(pids_file, "w") as out:
        out.write(json.dumps({"leader": os.getpid(), "helpers": helpers}))
    if mode == "crash":
        return 3
    time.sleep(3600)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
