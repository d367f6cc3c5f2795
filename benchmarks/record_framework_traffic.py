"""Record the request streams of real agent-framework apps (issue 23's "Measure"), for
``benchmarks/framework_traffic.py`` to replay.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/record_framework_traffic.py [--apps a,b,...] [--sessions 3]
        [--model smollm2-135m] [--max-tokens 32] [--out benchmarks/results/framework-traffic]

Starts ``kvflow serve --model MODEL`` (a pool large enough to cache everything: the recording
does not depend on it) behind the truth proxy (``benchmarks/_traffic_recording.py``) and runs each
app of ``benchmarks/traffic_apps`` with ``--sessions`` users at once, in the venv
``.ci/setup-frameworks`` builds for it. Writes ``<app>.jsonl`` per app: a meta line, then every
request in arrival order with its exact body, its ground truth (the framework's agent, the
session) and the reply the app got. An app that exits non-zero is reported and its file is still
written (what it sent is still traffic); one whose venv is missing is skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests" / "frameworks")]

from _traffic_recording import truth_proxy, write_records  # noqa: E402
from framework_runs import kvflow_serve  # noqa: E402

APPS_DIR = ROOT / "benchmarks" / "traffic_apps"
APPS = {  # app -> interpreter (the venv its framework installs in)
    "openai_agents": ROOT / ".venv-frameworks" / "bin" / "python",
    "crewai": ROOT / ".venv-crewai" / "bin" / "python",
    "autogen": ROOT / ".venv-frameworks" / "bin" / "python",
    "langgraph_supervisor": ROOT / ".venv-frameworks" / "bin" / "python",
    "instrumented_langgraph": Path(sys.executable),
}


def run_app(app: str, base_url: str, args: argparse.Namespace) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPENAI_API_KEY")}
    if app == "instrumented_langgraph":
        env["PYTHONPATH"] = str(ROOT)
    argv = [str(APPS[app]), str(APPS_DIR / f"{app}_traffic.py"), "--base-url", base_url, "--sessions",
            str(args.sessions), "--max-tokens", str(args.max_tokens)]
    proc = subprocess.run(argv, env=env, cwd=APPS_DIR, capture_output=True, text=True, timeout=args.timeout)
    return proc.returncode, proc.stdout + proc.stderr


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--apps", default=",".join(APPS))
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "framework-traffic")
    args = p.parse_args()
    apps = args.apps.split(",")
    unknown = set(apps) - set(APPS)
    if unknown:
        p.error(f"unknown apps {sorted(unknown)}; choose from {', '.join(APPS)}")
    args.out.mkdir(parents=True, exist_ok=True)
    flags = ["--model", args.model, "--device-tokens", "65536", "--host-tokens", "0", "--no-learned-hints"]
    with kvflow_serve(flags, args.out / "record-server.log") as url:
        for app in apps:
            if not APPS[app].exists():
                print(f"{app}: skipped ({APPS[app].parent.parent.name} is not built: bash .ci/setup-frameworks)")
                continue
            with truth_proxy(url) as (proxy, records):
                start = time.perf_counter()
                rc, output = run_app(app, proxy + "/v1", args)
                seconds = time.perf_counter() - start
            summary = next((json.loads(line) for line in reversed(output.splitlines()) if line.startswith('{"app"')),
                           None)
            meta = {"app": app, "model": args.model, "sessions": args.sessions, "max_tokens": args.max_tokens,
                    "exit": rc, "seconds": round(seconds, 1), "outcomes": summary and summary["outcomes"]}
            write_records(args.out / f"{app}.jsonl", meta, records)
            generated = sum(r["path"] != "/kvflow/v1/steps" for r in records)
            print(f"{app}: exit {rc}, {generated} requests, {len(records) - generated} steps updates, "
                  f"{seconds:.0f} s; outcomes {meta['outcomes']}")
            if rc != 0 or summary is None:
                print(output[-3000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
