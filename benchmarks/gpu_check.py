"""The embedded engine on a GPU in one run: environment, greedy correctness across cache paths, the
KVFlow comparison on an 8B-shaped model, the simulator's calibration and proof the mechanism ran.

Driven by ``benchmarks/gpu_check.sh`` (which sets ``PYTHONPATH`` and the carried wheels); runs from a
checkout with only torch, numpy, safetensors, tokenizers, jinja2 and pydantic (no server, no
LangGraph, no CLI). ``--dry-run`` runs every step on the CPU with tiny configurations (CI runs it).

1. Environment: GPU, torch, CUDA, free host memory, memory copy bandwidth; then batch-1 decode of
   the comparison model against the bandwidth bound (weight bytes / copy bandwidth).
2. Correctness: greedy tokens of one prompt computed cold, on a device hit, after a host reload and
   after a prefetch, for ``tiny-random`` and ``random-llama-small`` in bf16 and fp32. Any mismatch
   fails the check.
3. Comparison: the cyclic workflow (``--agents`` agents, ``--fixed``-token fixed prompts) and the
   MetaGPT graph, 1 and ``--concurrency`` concurrent workflows, on ``random-llama-3.1-8b`` in bf16
   (dry run: ``tiny-random``), the device pool holding about half the agents' fixed prompts and a
   pinned host pool, on the systems ``lru`` (host reload at admission), ``kvflow-evict``, ``kvflow``
   (eviction, prefetch, status-aware admission) and ``gpu-only`` (no host tier). The request
   sequence is the simulator's (its orchestrator: the same hints the runtime sends), replayed on the
   engine with each workflow's calls in order and the workflows concurrent. Reported: mean workflow
   time (warm-up excluded), time to first token, hit counters, bytes moved, prefetch time hidden
   under compute (share of copy intervals overlapping a forward pass).
4. Calibration: the same workloads in the simulator (H200 profile; the dry run uses it too, so its
   errors are meaningless on a CPU) and the error per system.
5. Mechanism: kvflow's counters show prefetch hits and its brain holds tagged fixed prefixes.

Writes ``OUT/gpu_check.json`` and prints a table; exits 1 when a correctness or mechanism check
failed (after writing the JSON), 2 on bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.base import GenerateRequest, SamplingParams
from backends.local import Engine, EngineConfig
from backends.sim.profiles import load_hardware
from backends.sim.simulate import simulate
from backends.sim.systems import SYSTEMS
from backends.sim.workloads import Workload, from_graph
from backends.sim.workloads import synthetic as synthetic_workload
from kvflow_orch.harness.calibrate import model_profile_of  # a light module: sim profiles only
from kvflow_orch.protocol import KVFlowHint, StepsUpdate

# check system -> (simulator system, engine options)
CHECK_SYSTEMS: dict[str, tuple[str, dict[str, Any]]] = {
    "lru": ("hicache", {"policy": "lru", "prefetch": False}),
    "kvflow-evict": ("kvflow-evict", {"policy": "kvflow", "prefetch": False}),
    "kvflow": ("kvflow", {"policy": "kvflow", "prefetch": True}),
    "gpu-only": ("gpu-only", {"policy": "lru", "prefetch": False, "host_tokens": 0}),
}
COUNTERS = ("device_hit_tokens", "prefetch_hit_tokens", "host_hit_tokens", "recomputed_tokens",
            "prefetched_tokens", "h2d_tokens", "d2h_tokens", "evicted_device_tokens")


# ---- environment --------------------------------------------------------------------------
def host_memory() -> dict[str, float]:
    out: dict[str, float] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, value = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(value.split()[0]) * 1024 / 2**30
    except OSError:
        pass
    return {"total_gib": round(out.get("MemTotal", 0.0), 1), "available_gib": round(out.get("MemAvailable", 0.0), 1)}


def environment(device: torch.device) -> dict[str, Any]:
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "device": str(device), "cpus": os.cpu_count(), "host_memory": host_memory(),
        "load_average": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        env.update(gpu=props.name, gpu_memory_gib=round(total / 2**30, 1), gpu_free_gib=round(free / 2**30, 1))
    env["copy_bandwidth_gbs"] = round(copy_bandwidth(device) / 1e9, 1)
    return env


def copy_bandwidth(device: torch.device) -> float:
    """Memory copy bandwidth (bytes read + written per second) of a tensor copy on ``device``
    (1 GiB on a GPU, timed with CUDA events; 128 MiB on the CPU), best of the repeats."""
    cuda = device.type == "cuda"
    a = torch.empty(2**30 if cuda else 2**27, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    best = float("inf")
    for _ in range(5):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            b.copy_(a)
            end.record()
            end.synchronize()
            seconds = start.elapsed_time(end) / 1e3
        else:
            t = time.perf_counter()
            b.copy_(a)
            seconds = time.perf_counter() - t
        best = min(best, seconds)
    return 2 * a.numel() / best


async def decode_speed(args: argparse.Namespace, bandwidth: float) -> dict[str, Any]:
    """Batch-1 decode of the comparison model against the bandwidth bound: every step reads all the
    weights once, so tokens/s can be at most the memory's measured throughput (a copy's bytes read +
    written per second) / weight bytes."""
    engine = make_engine(args.model, args.device, args.dtype, args.chunk, device_tokens=4096, host_tokens=0)
    try:
        weight_bytes = sum(p.numel() * p.element_size() for p in engine.scheduler.runner.model.parameters())
        prompt = tuple(range(3, 131))
        await timed_generate(engine, GenerateRequest(prompt, greedy(8)))  # warm-up
        rates = []
        for _ in range(3):
            start, stamps = time.perf_counter(), []
            async for _event in engine.stream(GenerateRequest(prompt, greedy(args.decode_tokens))):
                stamps.append(time.perf_counter() - start)
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    finally:
        engine.close()
        del engine
        release_memory()
    bound = bandwidth / weight_bytes
    rate = sorted(rates)[1]
    return {"model": args.model, "dtype": args.dtype, "weight_bytes": weight_bytes, "tokens_per_s": rate,
            "bandwidth_bound_tokens_per_s": bound, "share_of_bound": rate / bound}


def release_memory() -> None:
    """Free a closed engine's model and pools before the next one is built (16 GB each on the GPU run)."""
    import gc

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


# ---- engine helpers -----------------------------------------------------------------------
def make_engine(model: str, device: str, dtype: str, chunk: int, **cache: Any) -> Engine:
    return Engine(EngineConfig.build(model=model, device=device, dtype=dtype, chunk_tokens=chunk,
                                     write_through=True, **cache))


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


async def timed_generate(engine: Engine, request: GenerateRequest) -> tuple[tuple[int, ...], float]:
    """Output ids and time to first token (seconds)."""
    start = time.perf_counter()
    first = None
    result = None
    async for event in engine.stream(request):
        if first is None:
            first = time.perf_counter() - start
        if event.result is not None:
            result = event.result
    assert result is not None and first is not None
    return tuple(result.output_ids), first


# ---- 2. correctness -----------------------------------------------------------------------
def _prompts(vocab: int, fixed: int, seed: int) -> dict[str, tuple[int, ...]]:
    gen = torch.Generator().manual_seed(seed)
    return {a: tuple(torch.randint(3, vocab, (fixed,), generator=gen).tolist()) for a in ("planner", "coder", "critic")}


def _hint(agent: str, steps: dict[str, float | None]) -> KVFlowHint:
    return KVFlowHint(workflow_id="check", agent=agent, steps=steps)


async def correctness_case(model: str, device: str, dtype: str, *, fixed: int, tail: int, out: int) -> dict[str, Any]:
    """Greedy tokens of the planner's prompt: cold, device hit, host reload (lru engine), prefetched
    (kvflow engine); the pools hold two requests, so a third agent pushes the planner's prefix to host."""
    vocab = None
    scratch = make_engine(model, device, dtype, 512, device_tokens=4 * (fixed + tail + out), host_tokens=0)
    vocab = scratch.model_config.vocab_size
    prompts = _prompts(vocab, fixed, seed=1)
    tails = _prompts(vocab, tail, seed=2)

    def request(agent: str, steps: dict[str, float | None] | None = None) -> GenerateRequest:
        hint = _hint(agent, steps) if steps is not None else None
        return GenerateRequest(prompts[agent] + tails[agent], greedy(out), hint=hint,
                               fixed_prefix_tokens=fixed if hint else None)

    try:
        cold = (await scratch.generate(request("planner"))).output_ids
    finally:
        scratch.close()
        del scratch
    pool = 2 * (fixed + tail + out) + 8
    found: dict[str, Any] = {"cold": list(cold)}
    lru = make_engine(model, device, dtype, 512, device_tokens=pool, host_tokens=8 * pool, policy="lru", prefetch=False)
    try:
        await lru.generate(request("planner"))
        hit = await lru.generate(request("planner"))
        found["hit"] = list(hit.output_ids)
        found["hit_cached_tokens"] = hit.cached_tokens
        for agent in ("coder", "critic"):
            await lru.generate(request(agent))
        before = lru.stats()["host_hit_tokens"]
        found["reload"] = list((await lru.generate(request("planner"))).output_ids)
        found["reload_host_hit_tokens"] = lru.stats()["host_hit_tokens"] - before
    finally:
        lru.close()
        del lru
    kv = make_engine(model, device, dtype, 512, device_tokens=pool, host_tokens=8 * pool, policy="kvflow",
                     prefetch=True)
    try:
        await kv.generate(request("planner", {"planner": 0}))
        for agent in ("coder", "critic"):
            await kv.generate(request(agent, {"planner": None, agent: 0}))
        kv.apply_steps(StepsUpdate(workflow_id="check", steps={"planner": 1, "coder": None, "critic": None}))
        deadline = time.monotonic() + 60
        while kv.stats()["prefetched_tokens"] == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        before = kv.stats()["prefetch_hit_tokens"]
        found["prefetch"] = list((await kv.generate(request("planner", {"planner": 0}))).output_ids)
        found["prefetch_hit_tokens"] = kv.stats()["prefetch_hit_tokens"] - before
    finally:
        kv.close()
        del kv
        release_memory()
    problems = []
    for path in ("hit", "reload", "prefetch"):
        if found[path] != found["cold"]:
            diverge = next((i for i, (a, b) in enumerate(zip(found[path], found["cold"], strict=False)) if a != b),
                           min(len(found[path]), len(found["cold"])))  # or where the shorter one ends
            problems.append(f"{path} differs from cold at token {diverge}")
    if found["hit_cached_tokens"] < fixed:
        problems.append(f"the repeat hit only {found['hit_cached_tokens']} cached tokens")
    if found["reload_host_hit_tokens"] <= 0:
        problems.append("no host hit on the reload (the pool did not push the prefix to host)")
    if found["prefetch_hit_tokens"] <= 0:
        problems.append("no prefetch hit")
    return {"model": model, "dtype": dtype, "ok": not problems, "problems": problems, **found}


# ---- 3/4. comparison and calibration ------------------------------------------------------
def cyclic_workload(agents: int, fixed: int, dynamic: int, output: int, rounds: int, instances: int) -> Workload:
    from workflows.synthetic import stage_agents
    from workflows.synthetic import synthetic as synthetic_workflow

    graph = synthetic_workflow(n_agents=agents, fixed=0, dynamic=0, output=1, rounds=1).compile()
    return synthetic_workload(graph, stage_agents(agents, 1), fixed=fixed, dynamic=dynamic, output=output,
                              rounds=rounds, instances=instances)


def metagpt_workload(header: int, dynamic: int, output: int, loops: int, instances: int) -> Workload:
    from workflows.metagpt import metagpt

    return from_graph(metagpt().compile(), name="metagpt", dynamic=dynamic, output=output, loop_limit=loops,
                      instances=instances, tenant_header=header)


def pool_sizes(workload: Workload, per_request: int, concurrency: int, kv_bytes: int) -> tuple[int, int, bool]:
    """Device: about half the fixed prompts plus room for every running request; host: every fixed
    prompt plus the device pool and the running requests, capped at 40% of the free host memory
    (pinned memory is not swappable). Returns (device, host, whether the cap applied)."""
    fixed_total = workload.fixed_tokens_total
    device = fixed_total // 2 + concurrency * per_request
    host = fixed_total + device + concurrency * per_request
    cap = int(0.4 * host_memory()["available_gib"] * 2**30 / kv_bytes)
    return device, min(host, cap), cap < host


def model_config(name: str) -> Any:
    from backends.local.model.loader import RANDOM_MODELS, TINY_RANDOM_CONFIG

    if name == "tiny-random":
        return TINY_RANDOM_CONFIG
    if name in RANDOM_MODELS:
        return RANDOM_MODELS[name]
    raise ValueError(f"--model must be tiny-random or one of {', '.join(RANDOM_MODELS)}, got {name!r}")


def overlap(copies: Sequence[tuple[float, float]], busy: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``copies`` covered by some ``busy`` interval (both sorted lists of (start, end))."""
    busy = sorted(busy)
    total, j = 0.0, 0
    for start, end in sorted(copies):
        while j < len(busy) and busy[j][1] <= start:
            j += 1
        k = j
        while k < len(busy) and busy[k][0] < end:
            total += max(0.0, min(end, busy[k][1]) - max(start, busy[k][0]))
            k += 1
    return total


async def replay(engine: Engine, requests: Sequence[Any], workload: Workload) -> dict[str, Any]:
    """Each workflow's calls in order, the workflows concurrent; the warm-up (each agent of each
    workflow once) runs first and is not measured."""
    vocab = engine.model_config.vocab_size
    chains: dict[str, list[Any]] = {}
    for r in requests:
        chains.setdefault(r.hint.workflow_id, []).append(r)
    warm = {inst.workflow_id: len(inst.fixed) for inst in workload.instances}

    def to_request(r: Any) -> GenerateRequest:
        return GenerateRequest(tuple(t % vocab for t in r.prompt), greedy(len(r.output)), hint=r.hint,
                               fixed_prefix_tokens=r.fixed_tokens)

    async def chain(wid: str, part: slice) -> tuple[float, list[float]]:
        start, ttfts = time.perf_counter(), []
        for r in chains[wid][part]:
            ttfts.append((await timed_generate(engine, to_request(r)))[1])
        return time.perf_counter() - start, ttfts

    await asyncio.gather(*(chain(w, slice(0, warm[w])) for w in chains))
    before = engine.stats()
    runner, worker = engine.scheduler.runner, engine.scheduler.tiers.worker
    runner.busy = []
    if worker is not None:
        worker.copies = []
    results = await asyncio.gather(*(chain(w, slice(warm[w], None)) for w in chains))
    after = engine.stats()
    copies = list(worker.copies) if worker is not None else []
    runner.busy, hidden = None, overlap(copies, runner.busy or [])
    copy_s = sum(e - s for s, e in copies)
    ttfts = sorted(t for _, ts in results for t in ts)
    refs = {r.agent for r in requests}
    tagged = await engine.inspect_cache(lambda cache: sum(cache.fixed_prefix(ref) is not None for ref in refs))
    return {
        "workflow_s": sum(t for t, _ in results) / len(results),
        "ttft_mean_s": sum(ttfts) / len(ttfts), "ttft_p50_s": ttfts[len(ttfts) // 2],
        "ttft_max_s": ttfts[-1], "calls": len(ttfts),
        "counters": {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS},
        "prefetch_copy_s": copy_s, "prefetch_hidden_s": hidden,
        "prefetch_hidden_share": hidden / copy_s if copy_s else None,
        "tagged_prefixes": tagged, "agents": len(refs),
    }


def run_case(name: str, workload: Workload, args: argparse.Namespace, concurrency: int, per_request: int,
             deadline: float) -> dict[str, Any]:
    dtype_bytes = torch.empty((), dtype=getattr(torch, args.dtype)).element_size()
    mprof = model_profile_of(args.model, model_config(args.model), dtype_bytes)
    device_tokens, host_tokens, capped = pool_sizes(workload, per_request, concurrency, mprof.kv_bytes_per_token)
    case: dict[str, Any] = {"workload": name, "concurrency": concurrency, "labels": dict(workload.labels),
                            "device_tokens": device_tokens, "host_tokens": host_tokens, "host_capped": capped,
                            "kv_bytes_per_token": mprof.kv_bytes_per_token, "systems": {}}
    hw = load_hardware("h200")
    captured: list[Any] = []
    simulate(SYSTEMS["kvflow"], workload, hw, mprof, device_tokens=device_tokens, host_tokens=host_tokens,
             on_submit=captured.append)
    for system, (sim_name, options) in CHECK_SYSTEMS.items():
        if time.monotonic() > deadline:
            case["systems"][system] = {"skipped": "time budget spent"}
            continue
        host = options.get("host_tokens", host_tokens)
        engine = make_engine(args.model, args.device, args.dtype, args.chunk, device_tokens=device_tokens,
                             host_tokens=host, max_batch=max(8, concurrency), namespace_cap_tokens=device_tokens,
                             **{k: v for k, v in options.items() if k != "host_tokens"})
        try:
            measured = asyncio.run(_replay_and_close(engine, captured, workload))
        finally:
            engine.close()
            del engine
            release_memory()
        moved = measured["counters"]["h2d_tokens"] + measured["counters"]["d2h_tokens"]
        measured["bytes_moved"] = moved * case["kv_bytes_per_token"]
        sim = simulate(SYSTEMS[sim_name], workload, hw, mprof, device_tokens=device_tokens,
                       host_tokens=host if SYSTEMS[sim_name].host_tier else None)
        measured["simulated_workflow_s"] = sim.latency_s
        measured["simulator_error"] = sim.latency_s / measured["workflow_s"] - 1.0
        case["systems"][system] = measured
    base = case["systems"].get("lru", {}).get("workflow_s")
    for res in case["systems"].values():
        if base and "workflow_s" in res:
            res["speedup_over_lru"] = base / res["workflow_s"]
    return case


async def _replay_and_close(engine: Engine, requests: Sequence[Any], workload: Workload) -> dict[str, Any]:
    await engine.start()
    try:
        return await replay(engine, requests, workload)
    finally:
        await engine.shutdown()


# ---- main ---------------------------------------------------------------------------------
def settings(args: argparse.Namespace) -> None:
    """Fill the defaults of the GPU run or of the dry run."""
    gpu = not args.dry_run
    defaults = {
        "model": "random-llama-3.1-8b" if gpu else "tiny-random",
        "device": "cuda" if gpu else "cpu",
        "dtype": "bfloat16" if gpu else "float32",
        "agents": 6, "fixed": 4096 if gpu else 256, "dynamic": 32 if gpu else 16,
        "output": 32 if gpu else 8, "rounds": 3, "concurrency": 8,
        "chunk": 2048 if gpu else 256, "budget": 400.0 if gpu else 150.0, "decode_tokens": 64 if gpu else 16,
    }
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)


def correctness_matrix() -> list[tuple[str, str]]:
    """The same on the GPU and in the dry run (only the device differs)."""
    return [(m, d) for m in ("tiny-random", "random-llama-small") for d in ("bfloat16", "float32")]


def print_table(report: dict[str, Any]) -> None:
    env = report["environment"]
    print(f"\n== environment: {env.get('gpu', 'CPU')} | torch {env['torch']} | CUDA {env['cuda']} | "
          f"host memory {env['host_memory']['available_gib']} of {env['host_memory']['total_gib']} GiB free")
    d = report.get("decode", {})
    if "tokens_per_s" in d:
        print(f"== batch-1 decode {d['model']} {d['dtype']}: {d['tokens_per_s']:.1f} tokens/s, "
              f"{d['share_of_bound']:.0%} of the bandwidth bound ({d['bandwidth_bound_tokens_per_s']:.1f} tokens/s: "
              f"{env['copy_bandwidth_gbs']} GB/s copy over {d['weight_bytes'] / 2**30:.2f} GiB of weights)")
    print("== correctness (greedy tokens cold / hit / reload / prefetch)")
    for c in report["correctness"]:
        print(f"  {c['model']:22s} {c['dtype']:9s} {'OK' if c['ok'] else 'FAIL: ' + '; '.join(c['problems'])}")
    print("== comparison (workflow s, mean TTFT s, speedup over lru, prefetch hidden, simulator error)")
    for case in report["comparison"]:
        print(f"  {case['workload']} x{case['concurrency']} "
              f"(device {case['device_tokens']}, host {case['host_tokens']} tokens)")
        for name, r in case["systems"].items():
            if "skipped" in r:
                print(f"    {name:13s} skipped: {r['skipped']}")
                continue
            hidden = "-" if r["prefetch_hidden_share"] is None else f"{r['prefetch_hidden_share']:.0%}"
            c = r["counters"]
            print(f"    {name:13s} {r['workflow_s']:8.3f}s  ttft {r['ttft_mean_s']:.4f}s  "
                  f"x{r.get('speedup_over_lru', float('nan')):.2f}  hidden {hidden:>4s}  "
                  f"sim {r['simulator_error']:+.0%}  "
                  f"hits dev/pf/host {c['device_hit_tokens']}/{c['prefetch_hit_tokens']}/{c['host_hit_tokens']} "
                  f"recomputed {c['recomputed_tokens']} moved {r['bytes_moved'] / 2**20:.1f} MiB")
    print("== mechanism")
    for m in report["mechanism"]:
        print(f"  {'OK  ' if m['ok'] else 'FAIL'} {m['what']}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every step on the CPU with tiny configurations")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    parser.add_argument("--model", help="comparison model (default random-llama-3.1-8b; dry run tiny-random)")
    parser.add_argument("--device")
    parser.add_argument("--dtype")
    for flag in ("agents", "fixed", "dynamic", "output", "rounds", "concurrency", "chunk", "decode-tokens"):
        parser.add_argument(f"--{flag}", type=int)
    parser.add_argument("--budget", type=float, help="seconds after which remaining comparison runs are skipped")
    args = parser.parse_args(argv)
    settings(args)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (torch.cuda.is_available() is False); use --dry-run on a CPU", file=sys.stderr)
        return 2
    start = time.monotonic()
    device = torch.device(args.device)
    report: dict[str, Any] = {"command": " ".join(sys.argv), "dry_run": args.dry_run,
                              "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
                              "environment": environment(device), "correctness": [], "comparison": [], "mechanism": []}
    failed = False
    for model, dtype in correctness_matrix():
        try:
            case = asyncio.run(correctness_case(model, args.device, dtype, fixed=96 if args.dry_run else 512,
                                                tail=16, out=12))
        except Exception as exc:
            case = {"model": model, "dtype": dtype, "ok": False, "problems": [f"crashed: {exc!r}"],
                    "traceback": traceback.format_exc()}
        failed |= not case["ok"]
        report["correctness"].append(case)
        print(f"correctness {model} {dtype}: {'OK' if case['ok'] else case['problems']}", flush=True)
    try:
        report["decode"] = asyncio.run(decode_speed(args, report["environment"]["copy_bandwidth_gbs"] * 1e9))
    except Exception as exc:
        report["decode"] = {"error": repr(exc), "traceback": traceback.format_exc()}
    print(f"decode: {report['decode']}", flush=True)
    per_request = args.fixed + args.dynamic + args.output
    deadline = start + args.budget
    cases = []
    for concurrency in (1, args.concurrency):
        cases.append(("cyclic", cyclic_workload(args.agents, args.fixed, args.dynamic, args.output,
                                                args.rounds, concurrency), concurrency, per_request))
    header = args.fixed // 2
    meta_per_request = header + 1024 + args.dynamic + args.output  # role prompts are under 1,024 tokens
    for concurrency in (1, args.concurrency):
        cases.append(("metagpt", metagpt_workload(header, args.dynamic, args.output, 2, concurrency),
                      concurrency, meta_per_request))
    for name, workload, concurrency, per_req in cases:
        try:
            case = run_case(name, workload, args, concurrency, per_req, deadline)
        except Exception as exc:
            case = {"workload": name, "concurrency": concurrency, "error": repr(exc), "systems": {},
                    "traceback": traceback.format_exc()}
            failed = True
        report["comparison"].append(case)
        print(f"comparison {name} x{concurrency}: done at {time.monotonic() - start:.0f}s", flush=True)
    for case in report["comparison"]:
        kv = case["systems"].get("kvflow", {})
        if "counters" not in kv:
            continue
        label = f"{case['workload']} x{case['concurrency']}"
        checks = [(f"{label}: kvflow had prefetch hits", kv["counters"]["prefetch_hit_tokens"] > 0),
                  (f"{label}: kvflow's brain holds tagged fixed prefixes "
                   f"({kv['tagged_prefixes']} of {kv['agents']} agents)",
                   kv["tagged_prefixes"] > 0)]
        for what, ok in checks:
            report["mechanism"].append({"what": what, "ok": bool(ok)})
            failed |= not ok
    report["wall_s"] = time.monotonic() - start
    report["ok"] = not failed
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_check.json"
    path.write_text(json.dumps(report, indent=1, default=str) + "\n")
    print_table(report)
    print(f"\nwrote {path} in {report['wall_s']:.0f}s: {'OK' if not failed else 'FAILED'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
