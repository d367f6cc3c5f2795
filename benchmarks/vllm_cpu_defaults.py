"""Per-miss prefill of ``kvflow serve --engine vllm`` on a CPU host: vLLM's own defaults (the model's
bfloat16, one core reserved for the API server) against the plain command with the launcher's CPU
defaults (float32 without native bfloat16, no reserved core on <= 4 cores, eager). Both servers are
up at once and their requests interleave, so load drift hits both alike.

    .venv-vllm/bin/python benchmarks/vllm_cpu_defaults.py MODEL_DIR [--requests N]

MODEL_DIR: ``kvflow export-model smollm2-135m DIR``. Results: benchmarks/results/vllm/launcher_cpu_defaults.txt.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
WORDS = "check the plan before you write code and test every change with care".split()
PROMPT_WORDS = 700


def start(model: str, port: int, extra: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    plain = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model", model,
                                 "--port", str(port), "--device-tokens", "4096", "--block-size", "32", *extra],
                                stdout=out, stderr=subprocess.STDOUT, env={**plain, **env}, cwd=ROOT)


def wait_up(servers: dict[str, tuple[str, subprocess.Popen]], started: float) -> None:
    up: set[str] = set()
    while len(up) < len(servers):
        for name, (url, proc) in servers.items():
            if name in up:
                continue
            if proc.poll() is not None:
                raise SystemExit(f"{name}: the server exited with {proc.returncode}")
            try:
                ok = httpx.get(url + "/health").status_code == 200
            except httpx.HTTPError:
                ok = False
            if ok:
                up.add(name)
                print(f"{name} up at {time.time() - started:.0f} s", flush=True)
        time.sleep(2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--requests", type=int, default=5, help="distinct prompts (the first one is a warm-up)")
    args = parser.parse_args()
    print("load before", os.getloadavg(), flush=True)
    variants = {"before: bfloat16, 1 reserved core (eager)": (["--dtype", "bfloat16", "--enforce-eager"],
                                                              {"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"}),
                "now: plain command (float32, 0 reserved, eager)": ([], {})}
    servers = {}
    started = time.time()
    for i, (name, (extra, env)) in enumerate(variants.items()):
        port = 18711 + i
        proc = start(args.model, port, extra, env, Path(f"/tmp/vllm-cpu-defaults-{port}.log"))
        servers[name] = (f"http://127.0.0.1:{port}", proc)
    try:
        wait_up(servers, started)
        latency: dict[str, list[float]] = {name: [] for name in servers}
        first_tokens: dict[str, list[str]] = {name: [] for name in servers}
        for i in range(args.requests):
            prompt = f"[{uuid.uuid4().hex}] " + " ".join(WORDS[j % len(WORDS)] for j in range(PROMPT_WORDS))
            order = list(servers.items())
            for name, (url, _) in order[i % 2:] + order[:i % 2]:
                t0 = time.perf_counter()
                reply = httpx.post(url + "/v1/completions", timeout=600, json={
                    "model": args.model, "prompt": prompt, "max_tokens": 1, "temperature": 0})
                latency[name].append(time.perf_counter() - t0)
                first_tokens[name].append(reply.json()["choices"][0]["text"])
        print("load after", os.getloadavg())
        medians = {name: statistics.median(values[1:]) for name, values in latency.items()}
        before = next(iter(medians.values()))
        for name, values in latency.items():
            print(f"{name:50s} median per miss ({PROMPT_WORDS}-token prompt, 1 token) {medians[name]:7.3f} s  "
                  f"{[round(x, 2) for x in values]}  before / this = {before / medians[name]:.2f}x")
        tokens = list(first_tokens.values())
        print("first tokens equal across dtypes:", tokens[0] == tokens[1])
    finally:
        for _, proc in servers.values():
            proc.terminate()
        for _, proc in servers.values():
            proc.wait(60)


if __name__ == "__main__":
    main()
