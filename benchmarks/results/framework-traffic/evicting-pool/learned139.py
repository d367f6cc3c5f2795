"""The learned replay of instrumented_langgraph at pool 139 alone (LRU, declared and Belady do not
depend on the learner: results-main-8213cd3.json has them on the same recording). Run from the
repository root with PYTHONPATH=$PWD; the one argument is the results file it writes."""

import json
import subprocess
import sys
import time
from pathlib import Path

sys.path[:0] = ["benchmarks", "tests/frameworks"]

import framework_traffic as ft  # noqa: E402
from _traffic_recording import read_records  # noqa: E402


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


print(time.strftime("%Y-%m-%d %H:%M:%S"), "uptime:", uptime(), flush=True)
meta, records = read_records(Path("benchmarks/results/framework-traffic/instrumented_langgraph.jsonl"))
run = ft.replay_run(records, meta["model"], 139, "learned")
ft.progress("instrumented_langgraph", "learned", run)
out = {k: v for k, v in run.items() if not k.startswith("_")}
out["belady_learned"] = ft.belady(run)
print(json.dumps(out))
print("uptime after:", uptime())
Path(sys.argv[1]).write_text(json.dumps(out, indent=1) + "\n")
