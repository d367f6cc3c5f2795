"""Issue 26's skewed supervisor loop: one long run from empty statistics, static vs learned steps.

    flock /tmp/kvflow-timing.lock python benchmarks/learned_skewed_loop.py [--rounds 80] [--fixed 320]
        [--pool 3.3] [--out benchmarks/results/learned-skewed-loop]

The check the learned-routing benchmark did not cover: a supervisor over 6 workers chosen with
skewed probabilities (50/25/12/7/4/2%, ``workflows.supervisor(weights=...)``), ``--rounds`` worker
turns in one ``run(...)`` with a fresh ``branch_stats=BranchStats()``, served by
``kvflow serve --model tiny-random --host-tokens 0 --policy kvflow`` with a device pool for about
``--pool`` of the ~2,000-token fixed prompts. Each configuration (static, learned) runs twice:

1. against ``kvflow serve`` started as users start it (a subprocess of the CLI): the headline figures;
2. against the same server app in this process with the brain's calls recorded, whose counters
   must equal run 1's (the same requests), so the bounds replayed from the recording are bounds on
   run 1: Bélády, the best online order A0, the floor (``_learned_bounds``), and the Markov-paging
   optimum over the run's own path.

Printed side by side: recomputed prompt tokens (the server's ``recomputed_tokens``), cached tokens
per agent, learned / static (target <= 0.85x) and every bound over static. Outputs must match
(caching never changes greedy outputs).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

from _learned_bounds import brain_bounds, markov_paging, print_brain_bounds, print_markov  # noqa: E402

from kvflow_orch import BranchStats, run  # noqa: E402
from workflows.supervisor import routing, supervisor  # noqa: E402

WEIGHTS = (50, 25, 12, 7, 4, 2)
TARGET = 0.85


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None = None, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"kvflow serve exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{url} did not become healthy in {timeout}s")


def server_stats(url: str) -> dict:
    with urllib.request.urlopen(url + "/kvflow/v1/stats", timeout=30) as r:
        return json.loads(r.read())


def run_loop(wf, url: str, learned: bool, rounds: int) -> dict:
    stats = BranchStats() if learned else None
    t = time.perf_counter()
    result = run(wf, {"task": "skewed"}, backend=url, branch_stats=stats, max_steps=4 * rounds + 8)
    wall = time.perf_counter() - t
    cached = Counter()
    for c in result.calls:
        cached[c.node] += c.cached_tokens
    return {"recomputed": server_stats(url)["recomputed_tokens"], "cached": dict(cached), "wall": wall,
            "outputs": [(c.node, c.completion_tokens) for c in result.calls] + [result.state.get("work")],
            "path": [c.node for c in result.calls]}


def served(args, wf, learned: bool) -> dict:
    """Run 1: ``kvflow serve`` as a subprocess of the CLI."""
    port = free_port()
    cmd = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", "tiny-random", "--host-tokens", "0",
           "--policy", "kvflow", "--device-tokens", str(args.device), "--port", str(port)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, proc)
        return run_loop(wf, url, learned, args.rounds)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def recorded(args, wf, learned: bool) -> tuple[dict, object, object]:
    """Run 2: the same server app in this process, its brain's calls recorded."""
    import uvicorn

    from backends.kvcache.trace import BrainRecorder
    from backends.local import Engine, EngineConfig
    from backends.server import create_app

    # the configuration kvflow serve builds from the same flags
    engine = Engine(EngineConfig.build(model="tiny-random", policy="kvflow", prefetch=True, device_tokens=args.device,
                                       host_tokens=0))
    recorder = BrainRecorder(engine.scheduler.cache)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url)
        return run_loop(wf, url, learned, args.rounds), recorder, engine.config.cache
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def prompt_tokens(wf) -> int:
    from backends.local import Engine, EngineConfig

    engine = Engine(EngineConfig.build(model="tiny-random"))
    asg = wf.compile()
    sizes = [len(engine.tokenizer.encode(asg.system_prompt(a))) for a in asg.agents]
    engine.close()
    return round(sum(sizes) / len(sizes)) + 16  # the chat template's tokens around it, about


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=80)
    p.add_argument("--fixed", type=int, default=320,
                   help="filler words per role prompt (320: about 2,000 tokens in tiny-random's tokenizer)")
    p.add_argument("--dynamic", type=int, default=16)
    p.add_argument("--output", type=int, default=8)
    p.add_argument("--pool", type=float, default=3.3, help="device pool in fixed prompts")
    p.add_argument("--out", type=Path, default=None, help="write summary.txt and results.json here")
    args = p.parse_args()
    load = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  uptime: {load()}")
    wf = supervisor(workers=len(WEIGHTS), rounds=args.rounds, fixed=args.fixed, dynamic=args.dynamic,
                    output=args.output, weights=WEIGHTS)
    args.prompt = prompt_tokens(wf)
    args.device = int(args.pool * args.prompt)
    print(f"supervisor + {len(WEIGHTS)} workers ({'/'.join(map(str, WEIGHTS))}%), {args.rounds} rounds in one run, "
          f"fresh BranchStats(); fixed prompts ~{args.prompt} tokens; kvflow serve --model tiny-random "
          f"--host-tokens 0 --policy kvflow --device-tokens {args.device} ({args.pool} prompts)\n")
    res, rec = {}, {}
    for name in ("static", "learned"):
        res[name] = served(args, wf, name == "learned")
        rec[name] = recorded(args, wf, name == "learned")
    agents = sorted({a for r in res.values() for a in r["cached"]})
    print(f"{'steps':<9} {'recomputed':>11} {'wall s':>7}   cached tokens per agent")
    for name, r in res.items():
        cached = ", ".join(f"{a} {r['cached'].get(a, 0)}" for a in agents)
        print(f"{name:<9} {r['recomputed']:>11} {r['wall']:>7.1f}   {cached}")
    same_requests = all(rec[n][0]["recomputed"] == res[n]["recomputed"] for n in res)
    print(f"\nin-process recorded runs: static {rec['static'][0]['recomputed']}, "
          f"learned {rec['learned'][0]['recomputed']} recomputed "
          f"({'the same as kvflow serve' if same_requests else 'DIFFERENT from kvflow serve'})")
    probs = routing(len(WEIGHTS), weights=WEIGHTS)["supervisor"]
    bounds = brain_bounds({n: rec[n][1] for n in rec}, {n: rec[n][0]["recomputed"] for n in rec},
                          rec["static"][2], probs)
    print_brain_bounds(bounds)
    markov = markov_paging(res["static"]["path"], probs, "supervisor", int(args.pool))
    print_markov(markov)
    static_recomputed = max(1, res["static"]["recomputed"])
    ratio = res["learned"]["recomputed"] / static_recomputed
    best = min(bounds["a0"], bounds["runs"]["learned"]["engine"]) / static_recomputed
    print(f"\n  {'PASS' if ratio <= 1 else 'FAIL'}  learned recomputes <= static: {ratio:.3f}x")
    print(f"  {'PASS' if ratio <= TARGET else 'FAIL'}  learned <= {TARGET}x static: {ratio:.3f}x; best online (A0) "
          f"{bounds['a0'] / static_recomputed:.3f}x, belady {bounds['belady'] / static_recomputed:.3f}x, "
          f"floor {bounds['floor'] / static_recomputed:.3f}x"
          + (f"  -> {TARGET}x is out of reach online here" if best > TARGET else ""))
    same = res["static"]["outputs"] == res["learned"]["outputs"]
    print(f"  {'PASS' if same else 'FAIL'}  same outputs with static and learned steps")
    print(f"uptime after: {load()}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"args": {k: v for k, v in vars(args).items() if k != "out"},
             "runs": {n: {k: v for k, v in r.items() if k != "outputs"} for n, r in res.items()},
             "bounds": {k: v for k, v in bounds.items()},
             "markov": {w: markov[w].__dict__ for w in ("own", "long")}}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
