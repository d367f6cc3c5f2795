"""Scale-out: kvflow workers behind SGLang's model gateway (smg), with and without workflow routing.

``kvflow cluster``'s machinery starts W tiny-random workers (``--host-tokens 0``: every cached token
is a device hit) and smg in front, then N MetaGPT-style workflows run at once through
:class:`~kvflow_orch.clients.GatewayClient`. The workflows belong to C companies (namespaces), each
with its own five role prompts, so the fixed prompts total C * 5 prompts and each worker's device
pool holds about 1/W of them. Measured per configuration, on fresh workers:

* ``round_robin``: smg's round-robin policy, no hints, no routing header, no steps;
* ``workflow``: smg's manual policy, ``x-smg-routing-key: <namespace>/<workflow_id>``, hints, steps;
* ``agent``: the same with ``x-smg-routing-key: <namespace>/<agent>``;
* ``agent+kill``: ``agent`` with one worker killed (SIGKILL) once a third of the calls are done.

The figure is the fixed-prompt device hit ratio: over every call, the fixed-prefix tokens found on
device (``min(cached_tokens, fixed_prefix_tokens)``) over all fixed-prefix tokens. Also: errors,
workflows finished, wall time. Loopback only; every loop is bounded (N workflows of 7 calls).

    python benchmarks/scaleout.py [--workers 3] [--workflows 24] [--companies 6] [--prompt-chars 300]
                                  [--out benchmarks/results/scaleout/tiny_random.json]

``--sim`` runs the same comparison in the simulator (``backends.sim.scaleout``) instead, on hardware
and model profiles (default: 8 workers, H100 SXM, Llama-3.1-8B, the full MetaGPT role prompts), with
``agent+kill`` killing worker 1 a third of the way through the round-robin run's makespan:

    python benchmarks/scaleout.py --sim [--workers 8] [--workflows 64] [--companies 16]
                                  [--out benchmarks/results/scaleout/sim_h100.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import sys
import time
from typing import Any

from kvflow_orch import END, START, Workflow, arun
from kvflow_orch.harness.cluster import start_cluster
from kvflow_orch.clients import GatewayClient, GatewayConfig
from kvflow_orch.protocol import KVFlowHint, Sampling
from workflows.metagpt_roles import ARCHITECT, ENGINEER, PRODUCT_MANAGER, PROJECT_MANAGER, QA_ENGINEER

ROLES = {"product_manager": PRODUCT_MANAGER, "architect": ARCHITECT, "project_manager": PROJECT_MANAGER,
         "engineer": ENGINEER, "qa": QA_ENGINEER}
CALLS_PER_WORKFLOW = 7  # PM, architect, project manager, then engineer and QA twice
CONFIGS = {
    "round_robin": ("round_robin", GatewayConfig(routing="none", hints=False)),
    "workflow": ("manual", GatewayConfig(routing="workflow")),
    "agent": ("manual", GatewayConfig(routing="agent")),
    "agent+kill": ("manual", GatewayConfig(routing="agent")),
}


def company(index: int, prompt_chars: int, max_tokens: int) -> Workflow:
    """MetaGPT's pipeline with one company's role prompts (every company's differ from the first token)."""
    def system(role: str) -> str:
        return f"Company {index}, {role}.\n{ROLES[role][:prompt_chars]}"

    wf = Workflow(f"company{index}")
    wf.add_agent("product_manager", system("product_manager"), "Idea: {idea}", output="prd", max_tokens=max_tokens)
    wf.add_agent("architect", system("architect"), "PRD: {prd}", output="design", max_tokens=max_tokens)
    wf.add_agent("project_manager", system("project_manager"), "Design: {design}", output="plan", max_tokens=max_tokens)
    for round_ in (1, 2):
        wf.add_agent(f"engineer{round_}", system("engineer"), "Plan: {plan} Review: {review}", agent="engineer",
                     output="code", max_tokens=max_tokens)
        wf.add_agent(f"qa{round_}", system("qa"), "Code: {code}", agent="qa", output="review", max_tokens=max_tokens)
    wf.add_edge(START, "product_manager")
    for a, b in (("product_manager", "architect"), ("architect", "project_manager"),
                 ("project_manager", "engineer1"), ("engineer1", "qa1"), ("qa1", "engineer2"), ("engineer2", "qa2")):
        wf.add_edge(a, b)
    wf.add_edge("qa2", END)
    return wf


class MeasuredClient(GatewayClient):
    """Counts every call's fixed-prefix tokens (the system message, by the workers' tokenizer, so the
    figure is the same with and without hints) and how many of them the worker had cached."""

    fixed = hits = calls = 0
    tokenizer: Any = None

    async def chat(self, messages: Any, sampling: Sampling, hint: KVFlowHint | None) -> Any:
        reply = await super().chat(messages, sampling, hint)
        self.calls += 1
        fixed = self.tokenizer.encode_chat(list(messages), fixed_messages=1).fixed_prefix_tokens
        self.fixed += fixed
        self.hits += min(reply.cached_tokens, fixed)
        return reply


def _tokenizer() -> Any:
    from backends.local import Engine, EngineConfig

    engine = Engine(EngineConfig.build(model="tiny-random", device_tokens=1024, host_tokens=0))
    engine.close()
    return engine.tokenizer


async def _drive(client: MeasuredClient, args: argparse.Namespace, kill: Any) -> dict[str, Any]:
    workflows = [company(i % args.companies, args.prompt_chars, args.max_tokens) for i in range(args.workflows)]

    async def one(i: int) -> str | None:
        await asyncio.sleep(i * args.stagger_s)  # arrivals spread out, as in a service; all overlap
        try:
            await arun(workflows[i], {"idea": f"app {i}", "review": "none"}, backend=client,
                       namespace=f"company{i % args.companies}", workflow_id=f"wf{i}")
            return None
        except Exception as exc:  # counted and reported, the figure is "zero errors"
            return f"{type(exc).__name__}: {exc}"

    async def killer() -> None:
        while client.calls < args.workflows * CALLS_PER_WORKFLOW // 3:
            await asyncio.sleep(0.05)
        kill()

    start = time.perf_counter()
    watch = asyncio.ensure_future(killer()) if kill else None
    errors = [e for e in await asyncio.gather(*(one(i) for i in range(args.workflows))) if e]
    if watch is not None:
        watch.cancel()
    await client.aclose()
    return {"wall_s": round(time.perf_counter() - start, 2), "calls": client.calls, "errors": len(errors),
            "first_errors": errors[:3], "finished": args.workflows - len(errors),
            "fixed_tokens": client.fixed, "fixed_hit_tokens": client.hits,
            "fixed_hit_ratio": round(client.hits / client.fixed, 4) if client.fixed else 0.0}


def measure(name: str, args: argparse.Namespace, device_tokens: int) -> dict[str, Any]:
    policy, config = CONFIGS[name]
    flags = ["--device-tokens", str(device_tokens), "--host-tokens", "0", "--policy", "kvflow"]
    with start_cluster(args.workers, "tiny-random", flags, gateway_policy=policy) as cluster:
        client = MeasuredClient(cluster.gateway, cluster.workers, config)
        client.tokenizer = args.tokenizer
        victim = cluster.processes[1]
        kill = (lambda: victim.send_signal(signal.SIGKILL)) if name.endswith("+kill") else None
        result = asyncio.run(_drive(client, args, kill))
    result["killed_worker"] = cluster.workers[1] if kill else None
    return result


def simulate(args: argparse.Namespace) -> dict[str, Any]:
    from backends.sim import load_hardware, load_model
    from backends.sim.scaleout import simulate_cluster
    from backends.sim.workloads import Instance, Workload, WorkflowSpec, text_tokens

    asg = company(0, 10**6, args.max_tokens).compile()
    specs = [WorkflowSpec(asg, {agent: text_tokens(f"Company {c}, {agent}.\n{ROLES[agent]}") for agent in ROLES},
                          dynamic_tokens=64, output_tokens=64) for c in range(args.companies)]
    instances = tuple(Instance(specs[i % args.companies], f"wf{i}", f"company{i % args.companies}", seed=i,
                               start_s=i * args.stagger_s) for i in range(args.workflows))
    workload = Workload("metagpt-companies", instances, warmup=False)
    fixed_total = workload.fixed_tokens_total
    device_tokens = fixed_total // args.workers
    hardware, model = load_hardware(args.hardware), load_model(args.model)
    print(f"simulated {args.workers} workers ({args.hardware}, {args.model}), {args.workflows} workflows, "
          f"{args.companies} companies: fixed prompts {fixed_total} tokens, device pool {device_tokens} per worker")
    results: dict[str, Any] = {}
    for name in args.configs.split(","):
        routing = "round_robin" if name == "round_robin" else name.removesuffix("+kill")
        fail = (1, results["round_robin"]["makespan_s"] / 3) if name.endswith("+kill") else None
        result = simulate_cluster(workload, hardware, model, workers=args.workers, routing=routing,
                                  device_tokens=device_tokens, fail=fail).to_json()
        results[name] = result
        print(f"{name:>12}: fixed-prompt device hit ratio {result['fixed_hit_ratio']:.3f}, finished "
              f"{result['workflows_finished']}/{result['workflows']}, rerouted {result['rerouted']}, "
              f"makespan {result['makespan_s']:.2f} s", flush=True)
    return {"fixed_prompt_tokens": fixed_total, "device_tokens": device_tokens, "hardware": args.hardware,
            "model": args.model, "results": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--workflows", type=int, default=24)
    parser.add_argument("--companies", type=int, default=6)
    parser.add_argument("--prompt-chars", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--stagger-s", type=float, default=0.05, help="seconds between workflow starts")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--out", default=None)
    parser.add_argument("--sim", action="store_true", help="run on the simulator instead of real workers")
    parser.add_argument("--hardware", default="h100-sxm", help="--sim: hardware profile")
    parser.add_argument("--model", default="llama-3.1-8b", help="--sim: model profile")
    args = parser.parse_args()
    if args.sim:
        for flag, default, sim_default in (("workers", 3, 8), ("workflows", 24, 64), ("companies", 6, 16),
                                           ("max_tokens", 4, 64)):
            if getattr(args, flag) == default:
                setattr(args, flag, sim_default)
        if args.stagger_s == 0.05:
            args.stagger_s = 0.5
        report = simulate(args)
        _ratios(report["results"])
        if args.out:
            _write(args.out, report)
        return 0
    args.tokenizer = _tokenizer()
    fixed_total = sum(len(f"Company {c}, {r}.\n{text[:args.prompt_chars]}") for c in range(args.companies)
                      for r, text in ROLES.items())
    device_tokens = fixed_total // args.workers
    print(f"{args.workers} workers, {args.workflows} workflows, {args.companies} companies: fixed prompts "
          f"{fixed_total} tokens (system text), device pool {device_tokens} tokens per worker")
    results = {}
    for name in args.configs.split(","):
        results[name] = measure(name, args, device_tokens)
        print(f"{name:>12}: fixed-prompt device hit ratio {results[name]['fixed_hit_ratio']:.3f}, "
              f"errors {results[name]['errors']}, finished {results[name]['finished']}/{args.workflows}, "
              f"{results[name]['wall_s']} s", flush=True)
    _ratios(results)
    if args.out:
        _write(args.out, {"machine": platform.machine(), "cpus": os.cpu_count(), "fixed_prompt_tokens": fixed_total,
                          "device_tokens": device_tokens, "results": results})
    return 0


def _ratios(results: dict[str, Any]) -> None:
    base = results.get("round_robin", {}).get("fixed_hit_ratio") or 0.0
    for name, r in results.items():
        if name != "round_robin" and base:
            r["vs_round_robin"] = round(r["fixed_hit_ratio"] / base, 2)
            print(f"{name:>12}: {r['vs_round_robin']}x round-robin")


def _write(path: str, report: dict[str, Any]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump({"command": " ".join(["python", *sys.argv]), **report}, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
