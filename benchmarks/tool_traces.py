"""Recorded tool-using apps replayed with their tool pauses (issue 24, "Real traces"): the OpenAI
Agents SDK and langgraph-supervisor recordings, on the embedded engine behind the real server, with
LRU, kvflow without continuations and kvflow with them, Bélády on each run's own schedule and the
floor beside them.

    flock /tmp/kvflow-timing.lock env PYTHONPATH=$PWD .venv/bin/python benchmarks/tool_traces.py \\
        [--apps openai_agents,langgraph_supervisor] [--copies 3] [--turns N] [--time-scale 0.1] \\
        [--pool-share 0.45] [--seed 0] [--model smollm2-135m] [--out DIR]

Input: the recordings ``benchmarks/record_framework_traffic.py`` wrote
(``benchmarks/results/framework-traffic/<app>.jsonl``: each request's exact body, its truth
``{agent, session}``, the reply the app got). Every reply there calls a tool (a handoff or a
function); the next request of that session carries the tool's result.

* **Sessions.** The recorded sessions run at once, each sending its requests in recorded order, the
  next one only after the previous reply and the tool's pause. Each session's bodies get an
  explicit session key, ``user`` = ``<app>/<session>/<copy>`` (plain traffic: no hint; issue 24
  asks that the key alone be enough). ``--copies N`` replays each recorded session N times; copy
  ``k > 0`` appends `` [copy k]`` to its first user message, so copies share the system prompt and
  tools but no conversation. The copies' replies then differ from the recorded ones while their next
  bodies carry the recorded reply, as a client replaying a log would; every run sends the same.
* **Tool pauses.** After a reply that calls tools the session waits the slowest of them (parallel
  calls), drawn per session, turn and tool from ``random.Random`` seeded by ``--seed``, then
  multiplied by ``--time-scale`` (printed; the engine's model calls take real time on this CPU):
  :data:`TOOL_CLASS` maps each recorded tool to **fast** (uniform 0.1-1 s) or **slow** (5-30 s):
  handoffs (``transfer_to_*``) and ``add`` fast, ``get_weather`` slow (an external service). A
  tool not named there is fast. The last request of a session pauses for nothing.
* **Runs**, each on a fresh engine (``kvflow serve``'s app in this process on 127.0.0.1, greedy, no
  host tier, prefetch off, one namespace may protect the whole pool): *floor* (LRU on a pool that
  holds everything, checked: no eviction), then on ``--pool-share`` of the sum of the paused
  conversations (each session's longest prompt plus its reply room): *lru*; *kvflow* (learned
  hints, ``--learned-hints``, no continuations: the plain-traffic kvflow); *kvflow+continuations*
  (the explicit key alone: no learner); *kvflow+continuations+learned* (both). The server keeps a
  conversation whose reply calls tools (``Engine.pause``) until the deadline the brain learns from
  the tools' observed pauses. *best-online*: kvflow with continuations and a declared hint per
  request (workflow = the session, agent = the recorded agent) whose ``resume_in_s`` is the exact
  pause that follows.
* **Bélády** is each run's executed schedule (``ScheduleRecorder``) replayed with Bélády's order
  (``replay_schedule``); LRU's schedule replayed with LRU must give back LRU's count (printed).
  Where the oracle cannot follow a schedule (its own choices leave the running requests locking
  more than the run's did: concurrent sessions here share the system prompt and tools) the run says
  so and is compared with Bélády on LRU's schedule instead. *No eviction on the run's own
  schedule* (the same schedule on an unbounded pool) is the token floor of that schedule: the
  *floor* run's own count is higher, its concurrent first calls each computing the shared cold
  prefix, and on this CPU its mean session time is no bound either (more requests run at once).

Prints mean session completion time and recomputed prompt tokens per run, their ratios to LRU and
to the run's own Bélády, ``uptime``; asserts greedy replies identical in every run. Writes
``tool_traces.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path
from statistics import mean
from typing import Any, Iterator

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests" / "frameworks")]

from _traffic_recording import read_records  # noqa: E402
from framework_runs import app_on_loopback  # noqa: E402
from framework_traffic import ROUTES, call_ids, comparable, stream  # noqa: E402
from react_tools import print_table  # noqa: E402

from backends.kvcache import CacheConfig  # noqa: E402
from backends.kvcache.trace import ScheduleRecorder, TraceError, replay_schedule  # noqa: E402
from backends.learn.host import reply_of_response  # noqa: E402

FAST, SLOW = (0.1, 1.0), (5.0, 30.0)
FLOOR_POOL = 32768
"""The floor's pool in tokens (the run checks it never evicts; its KV is allocated up front)."""
TOOL_CLASS = {"add": FAST, "get_weather": SLOW}
"""Recorded tool -> its duration range in seconds; ``transfer_to_*`` (handoffs) and unnamed tools: FAST."""

# (run, policy, continuations, learner, declared hints with the exact pause)
RUNS = (("lru", "lru", False, False, False), ("kvflow", "kvflow", False, True, False),
        ("kvflow+continuations", "kvflow", True, False, False),
        ("kvflow+continuations+learned", "kvflow", True, True, False),
        ("best-online", "kvflow", True, False, True))


# ---- the workload -------------------------------------------------------------------------
def tool_range(name: str) -> tuple[float, float]:
    return FAST if name.startswith("transfer_to_") else TOOL_CLASS.get(name, FAST)


def called(reply: dict[str, Any] | None) -> list[str]:
    return [str((c.get("function") or {}).get("name")) for c in (reply or {}).get("tool_calls") or []
            if isinstance(c, dict)]


def with_suffix(body: dict[str, Any], suffix: str) -> dict[str, Any]:
    """``body`` with ``suffix`` appended to its first user message's text."""
    messages = [dict(m) for m in body["messages"]]
    for m in messages:
        if m.get("role") != "user":
            continue
        if isinstance(m.get("content"), str):
            m["content"] += suffix
        else:
            parts = [dict(p) for p in m["content"]]
            text = next(p for p in parts if p.get("type") == "text")
            text["text"] += suffix
            m["content"] = parts
        break
    return {**body, "messages": messages}


def sessions(app: str, records: list[dict[str, Any]], copies: int, turns: int | None, seed: int,
             time_scale: float) -> list[dict[str, Any]]:
    """The replayed sessions: per recorded session and copy its bodies (session key added), the
    recorded agent and reply of each, the (scaled) pause after each and a small start offset."""
    by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in stream(records, declared=False):
        if r["path"] != "/v1/chat/completions":
            raise SystemExit(f"{app}: only chat traffic is replayed here, not {r['path']}")
        by_session[r["truth"]["session"]].append(r)
    out = []
    for name, recs in sorted(by_session.items()):
        recs = recs[:turns] if turns else recs
        for k in range(copies):
            key = f"{app}/{name}/{k}"
            rng = random.Random(f"{seed}/{key}")
            pauses = []
            for i, r in enumerate(recs):
                last = i + 1 == len(recs)
                pauses.append(0.0 if last else max((rng.uniform(*tool_range(t)) for t in called(r["reply"])),
                                                   default=0.0) * time_scale)
            bodies = [{**(with_suffix(r["body"], f" [copy {k}]") if k else r["body"]), "user": key} for r in recs]
            out.append({"key": key, "copy": k, "bodies": bodies, "agents": [r["truth"]["agent"] for r in recs],
                        "recorded": [r["reply"] for r in recs], "pauses": pauses,
                        "start_s": rng.uniform(0.0, 1.0) * time_scale})
    return out


def hinted(body: dict[str, Any], session: str, agent: str, resume_in_s: float | None) -> dict[str, Any]:
    """``body`` with a declared hint: the session as workflow, its agent running now, the pause."""
    hint: dict[str, Any] = {"workflow_id": session.replace("/", "-"), "agent": agent, "steps": {agent: 0}}
    if resume_in_s:
        hint["resume_in_s"] = resume_in_s
    return {**body, "custom_params": {"kvflow": hint}}


# ---- one run --------------------------------------------------------------------------------
@contextmanager
def served(model: str, pool: int, policy: str, continuations: bool, learner: bool) -> Iterator[tuple[str, Any]]:
    """``kvflow serve``'s app on 127.0.0.1 with its brain's schedule recorded; yields its URL and
    the recorder."""
    from backends.learn import TrafficLearner
    from backends.local import Engine, EngineConfig
    from backends.server import create_app

    engine = Engine(EngineConfig.build(model=model, policy=policy, device_tokens=pool, host_tokens=0,
                                       continuations=continuations, namespace_cap_tokens=pool, prefetch=False))
    recorder = ScheduleRecorder(engine.scheduler.cache)
    with app_on_loopback(create_app(engine, learner=TrafficLearner() if learner else None)) as url:
        yield url, recorder


async def play(url: str, plan: list[dict[str, Any]], declared: bool) -> dict[str, Any]:
    async with httpx.AsyncClient(base_url=url, timeout=1800) as client:

        async def session(s: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(s["start_s"])
            start = time.perf_counter()
            renamed: dict[str, str] = {}  # recorded tool-call id -> the id this run's server minted
            replies, prompts, paused = [], [], 0
            nexts = s["agents"][1:] + [None]
            for body, agent, recorded, pause, after in zip(s["bodies"], s["agents"], s["recorded"], s["pauses"], nexts,
                                                           strict=True):
                if declared:
                    body = hinted(body, s["key"], agent, pause if after == agent else None)
                text = json.dumps(body)
                for old, new in renamed.items():
                    text = text.replace(old, new)
                answer = await client.post("/v1/chat/completions", content=text,
                                           headers={"content-type": "application/json"})
                if answer.status_code != 200:
                    raise SystemExit(f"{s['key']}: answered {answer.status_code}: {answer.text[:300]}")
                reply = reply_of_response(ROUTES["/v1/chat/completions"], answer.content, bool(body.get("stream")))
                renamed.update({old: new for old, new in zip(call_ids(recorded), call_ids(reply), strict=False)
                                if old and new})
                replies.append(comparable(reply))
                prompts.append(answer.json()["usage"]["prompt_tokens"])
                paused += bool(called(reply))
                await asyncio.sleep(pause)
            return {"seconds": time.perf_counter() - start, "replies": replies, "prompts": prompts,
                    "tool_replies": paused,
                    "as_recorded": sum(comparable(r) == c for r, c in zip(s["recorded"], replies, strict=True))}

        done = await asyncio.gather(*(session(s) for s in plan))
        stats = (await client.get("/kvflow/v1/stats")).json()
    return {"sessions": done, "stats": stats}


def run(plan: list[dict[str, Any]], model: str, pool: int, policy: str, continuations: bool, learner: bool,
        declared: bool) -> dict[str, Any]:
    with served(model, pool, policy, continuations, learner) as (url, recorder):
        start = time.perf_counter()
        played = asyncio.run(play(url, plan, declared))
        seconds = time.perf_counter() - start
    stats, done = played["stats"], played["sessions"]
    config = CacheConfig(device_tokens=pool, policy="lru", prefetch=False)
    try:
        belady = replay_schedule(recorder.events, config, belady=True).stats.recomputed_tokens
        refused = None
    except TraceError as e:  # the oracle's own choices left running requests locking more than the run's
        belady, refused = None, str(e)
    unbounded = CacheConfig(device_tokens=FLOOR_POOL, policy="lru", prefetch=False)
    never_evicted = replay_schedule(recorder.events, unbounded).stats.recomputed_tokens
    return {"mean_job_s": mean(d["seconds"] for d in done), "seconds": round(seconds, 1),
            "recomputed_tokens": stats["recomputed_tokens"], "belady_recomputed_tokens": belady,
            "belady_refused": refused, "no_eviction_recomputed_tokens": never_evicted,
            "evicted": stats.get("evicted_device_tokens", 0), "requests": sum(len(d["replies"]) for d in done),
            "tool_replies": sum(d["tool_replies"] for d in done),
            "copy0_replies_as_recorded": sum(d["as_recorded"] for d, s in zip(done, plan, strict=True)
                                             if not s["copy"]),
            **{k: v for k, v in stats.items() if k.startswith("continuations_")},
            "_replies": [d["replies"] for d in done], "_prompts": [d["prompts"] for d in done],
            "_schedule": recorder.events}


def warm_up(model: str) -> None:
    """One untimed request on a throwaway engine: the process's first model call pays one-off costs
    (allocator, kernels) that no run should carry."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "temperature": 0}
    with served(model, 4096, "lru", False, False) as (url, _), httpx.Client(base_url=url, timeout=600) as client:
        client.post("/v1/chat/completions", json=body).raise_for_status()


def app_part(app: str, records: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    plan = sessions(app, records, args.copies, args.turns, args.seed, args.time_scale)
    floor = run(plan, args.model, FLOOR_POOL, "lru", False, False, False)
    if floor["evicted"]:
        raise SystemExit(f"{app}: the floor's pool of {FLOOR_POOL} tokens evicted")
    max_tokens = max(b.get("max_tokens") or b.get("max_completion_tokens") or 0 for s in plan for b in s["bodies"])
    paused = sum(max(p) + max_tokens for p in floor["_prompts"])
    pool = max(int(args.pool_share * paused), max(max(p) for p in floor["_prompts"]) + max_tokens + 16)
    runs: dict[str, dict[str, Any]] = {}
    for name, policy, cont, learner, declared in RUNS:
        if name in args.skip:
            continue
        runs[name] = run(plan, args.model, pool, policy, cont, learner, declared)
        print(f"  {app}: {name} done ({runs[name]['seconds']} s)", flush=True)
    runs["floor"] = floor
    first = runs["lru"]["_replies"]
    same = all(r["_replies"] == first for r in runs.values())
    lru_again = replay_schedule(runs["lru"]["_schedule"], CacheConfig(device_tokens=pool, policy="lru",
                                                                       prefetch=False)).stats.recomputed_tokens
    return {"sessions": len(plan), "copies": args.copies, "requests": runs["lru"]["requests"],
            "pool_tokens": pool, "paused_tokens": paused, "time_scale": args.time_scale,
            "greedy_outputs_identical": same, "lru_schedule_replayed_with_lru": lru_again,
            "pauses_s": sorted(round(p, 3) for s in plan for p in s["pauses"] if p),
            "runs": {n: {k: v for k, v in r.items() if not k.startswith("_")} for n, r in runs.items()}}


# ---- report ---------------------------------------------------------------------------------
def verdicts(app: str, part: dict[str, Any]) -> list[tuple[bool | None, str]]:
    runs = part["runs"]
    lru = runs["lru"]
    out: list[tuple[bool | None, str]] = []
    for name in ("kvflow+continuations", "kvflow+continuations+learned"):
        if name not in runs:
            continue
        r = runs[name]
        if r["belady_recomputed_tokens"] is None:
            out.append((None, f"{app}: {name}: Belady on its own schedule refused ({r['belady_refused']}); "
                              f"it recomputes {r['recomputed_tokens']}, Belady on LRU's schedule "
                              f"{lru['belady_recomputed_tokens']}"))
        else:
            ratio = r["recomputed_tokens"] / max(1, r["belady_recomputed_tokens"])
            out.append((ratio <= 1.1, f"{app}: {name} recomputes {r['recomputed_tokens']} = {ratio:.3f}x its own "
                                      f"Belady {r['belady_recomputed_tokens']} (target <= 1.1x)"))
        jct = lru["mean_job_s"] / r["mean_job_s"]
        held = part["pool_tokens"] / part["paused_tokens"]
        bound = lru["mean_job_s"] / runs["floor"]["mean_job_s"]
        target = held < 0.5
        out.append((jct >= 1.3 if target else None,
                    f"{app}: {name} mean session time {jct:.3f}x better than LRU (pool holds {held:.0%} of the paused "
                    f"conversations; {'target >= 1.3x' if target else 'no target: pool >= half'}; floor {bound:.3f}x)"))
    out.append((part["greedy_outputs_identical"], f"{app}: greedy outputs identical in every run"))
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recordings", type=Path, default=ROOT / "benchmarks" / "results" / "framework-traffic")
    p.add_argument("--apps", default="openai_agents,langgraph_supervisor")
    p.add_argument("--model", default=None, help="default: the recordings' model")
    p.add_argument("--copies", type=int, default=3, help="replays of each recorded session (default 3)")
    p.add_argument("--turns", type=int, default=None, help="only each session's first N requests")
    p.add_argument("--time-scale", type=float, default=0.1, help="tool pauses x this (default 0.1)")
    p.add_argument("--pool-share", type=float, default=0.45)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--skip", default="", help="comma-separated runs to leave out (not lru)")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    args.skip = set(filter(None, args.skip.split(",")))
    load = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  uptime: {load()}")
    print(f"tool pauses x {args.time_scale}: fast {FAST} s, slow {SLOW} s before scaling; slow: "
          f"{sorted(n for n, r in TOOL_CLASS.items() if r == SLOW)}; handoffs (transfer_to_*) and the rest fast")
    results: dict[str, Any] = {"args": {k: sorted(v) if isinstance(v, set) else str(v) for k, v in vars(args).items()}}
    failed = False
    recordings = {app: read_records(args.recordings / f"{app}.jsonl") for app in args.apps.split(",")}
    args.model = args.model or next(iter(recordings.values()))[0]["model"]
    warm_up(args.model)
    for app, (meta, records) in recordings.items():
        if meta["model"] != args.model:
            print(f"  note: {app} was recorded with {meta['model']}, replayed with {args.model}")
        part = results[app] = {"model": args.model, **app_part(app, records, args)}
        print_table(f"{app}: {part['sessions']} sessions ({args.copies} copies of each recorded one), "
                    f"{part['requests']} requests, {args.model}, tool pauses x {args.time_scale}; paused "
                    f"conversations {part['paused_tokens']} tokens", part)
        print("  no eviction on the run's own schedule (concurrent requests compute a shared cold prefix each): "
              + ", ".join(f"{n} {r['no_eviction_recomputed_tokens']}" for n, r in part["runs"].items()))
        print("  tool-calling replies per run: " + ", ".join(f"{n} {r['tool_replies']}/{r['requests']}"
                                                             for n, r in part["runs"].items()))
        for ok, text in verdicts(app, part):
            failed |= ok is False
            print(f"  {'PASS' if ok else 'FAIL' if ok is False else 'n/a '}  {text}")
        if args.out is not None:  # after each app: a later app's failure keeps the earlier ones
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "tool_traces.json").write_text(json.dumps(results, indent=1) + "\n")
    print(f"\nuptime after: {load()}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
