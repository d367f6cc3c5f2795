"""What the traffic learner adds per request, and its memory at 10,000 sessions (issue 23's cost target).

    flock /tmp/kvflow-timing.lock python benchmarks/learner_cost.py [--requests 6000] [--profile]

Framework-shaped plain traffic, as it reaches a host's chat route (a JSON body, no hint, no session
key), with the sizes the framework apps of ``tests/frameworks`` send:

* ``supervisor``: a langgraph-supervisor app: a supervisor and three workers, each with a ~1.5 kB
  system prompt carrying the date and 3-4 tools with JSON schemas; every request carries the whole
  conversation so far (up to ~40 messages, tool calls and results included);
* ``crew``: a CrewAI crew: each agent's own short conversation, the previous task's output carried
  in its prompt (session linking by carried reply lines);
* ``chat``: one long chat, 120 turns (the conversation grows to ~240 messages).

32 sessions run interleaved as concurrent users send them. A request's cost is what a host pays for
the learner on it: ``observe``, ``ended`` and ``reply`` on the body as JSON (the vLLM and SGLang
hosts have it parsed already; the embedded server validates it straight into its request model,
which keeps no session keys, and parses it a second time for the learner: that parse is printed
beside, as ``backends/server/learning.py`` does it). The stream is replayed
``--passes`` times, each on a fresh learner (the same decisions each time), and a request's cost is
its least time over the passes: the machine is shared, and a slice lost to another process is no
cost of the learner's. The figure the target applies to is the mean of that over the run, solves
included (p50, p99 and max beside it; the mean of the first pass alone too).

Then memory: ``tracemalloc`` over the learner alone (its default bounds: 10,000 live sessions) while
40,000 sessions with distinct keys arrive, one in four with a system prompt of its own (hostile
fingerprints). Traced memory is printed at every 10,000 sessions; once every bound is reached (the
content index's 65,536 entries fill last, by about 30,000) it must stay flat: the last figure
within 5% of the one before.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path
from typing import Iterator

from pydantic_core import from_json

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.learn import LearnerConfig, TrafficLearner

TARGET_MS = 0.1
WORDS = ("cache tokens agent prefix schedule worker planner latency budget result source claim evidence "
         "report summary draft table value metric figure revenue region quarter growth churn model").split()


def prose(rng: random.Random, words: int, lines: int = 1) -> str:
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(max(1, words // lines))).capitalize() + "."
                     for _ in range(lines))


def tool(name: str, props: int) -> dict:
    properties = {f"{name}_arg{i}": {"type": "string", "description": f"argument {i} of {name}"} for i in range(props)}
    return {"type": "function", "function": {"name": name, "description": f"Call {name}.", "parameters": {
        "type": "object", "properties": properties, "required": list(properties)[:2]}}}


class Agent:
    def __init__(self, rng: random.Random, role: str, tools: int) -> None:
        self.role = role
        self.prompt = f"You are the {role}. " + prose(rng, 220, 6) + " Today is {date}."
        self.tools = [tool(f"{role.lower().replace(' ', '_')}_{i}", 4) for i in range(tools)]


class Session:
    """One workflow instance; ``next_body`` is the request its next step sends."""

    def __init__(self, kind: str, agents: list[Agent], rng: random.Random, index: int) -> None:
        self.kind, self.agents, self.rng, self.index = kind, agents, rng, index
        self.history: list[dict] = [{"role": "user", "content": f"Task {index}: " + prose(rng, 60)}]
        self.step, self.last_reply = 0, ""

    def bodies(self) -> Iterator[dict]:
        steps = {"supervisor": 12, "crew": 4, "chat": 120}[self.kind]
        for self.step in range(steps):
            if self.kind == "supervisor":
                agent = self.agents[0] if self.step % 2 == 0 else self.agents[1 + (self.step // 2) % 3]
                messages = self.history
            elif self.kind == "crew":
                agent = self.agents[self.step]
                task = f"Task {self.index}.{self.step}: " + prose(self.rng, 40)
                context = f"\nContext from the previous task:\n{self.last_reply}" if self.last_reply else ""
                messages = [{"role": "user", "content": task + context}]
            else:
                agent, messages = self.agents[0], self.history
            yield {"model": "m", "temperature": 0, "tools": agent.tools, "messages": [
                {"role": "system", "content": agent.prompt.format(date=f"2025-05-{1 + self.index % 28:02d}")},
                *messages]}

    def replied(self, body: dict) -> dict:
        """The assistant's reply to ``body`` (kept in the conversation, as frameworks do)."""
        rng = self.rng
        if self.kind == "supervisor" and self.step % 2 == 1:
            call = {"id": f"call_{self.index}_{self.step}", "type": "function",
                    "function": {"name": "search", "arguments": json.dumps({"q": prose(rng, 6)})}}
            reply = {"role": "assistant", "content": None, "tool_calls": [call]}
            self.history += [reply, {"role": "tool", "tool_call_id": call["id"], "content": prose(rng, 90, 3)}]
            return reply
        reply = {"role": "assistant", "content": prose(rng, 80, 4)}
        self.last_reply = reply["content"]
        if self.kind != "crew":
            self.history.append(reply)
            if self.kind == "chat":
                self.history.append({"role": "user", "content": prose(rng, 40)})
        return reply


def traffic(requests: int, seed: int = 0) -> list[tuple[bytes, Session, dict]]:
    """``requests`` raw bodies of interleaved sessions, with the reply each one got."""
    rng = random.Random(seed)
    crews = {kind: [Agent(rng, role, tools) for role, tools in roles] for kind, roles in {
        "supervisor": [("Supervisor", 4), ("Research Analyst", 3), ("Python Coder", 3), ("Technical Writer", 3)],
        "crew": [("Senior Researcher", 0), ("Reporting Analyst", 0), ("Editor", 0), ("Fact Checker", 0)],
        "chat": [("Helpful Assistant", 0)]}.items()}
    out: list[tuple[bytes, Session, dict]] = []
    live: list[tuple[Session, Iterator[dict]]] = []
    index = 0
    while len(out) < requests:
        while len(live) < 32:
            kind = rng.choices(("supervisor", "crew", "chat"), (6, 3, 1))[0]
            session = Session(kind, crews[kind], random.Random(rng.random()), index)
            index += 1
            live.append((session, session.bodies()))
        i = rng.randrange(len(live))
        session, bodies = live[i]
        body = next(bodies, None)
        if body is None:
            live.pop(i)
            continue
        raw = json.dumps(body).encode()
        out.append((raw, session, session.replied(body)))
    return out


def serve(learner: TrafficLearner, stream: list[tuple[dict, dict]]) -> list[float]:
    """The learner's part of every request, in ms."""
    times = []
    clock = time.perf_counter
    for body, reply in stream:
        t = clock()
        learned = learner.observe(body, route="chat")
        learner.ended()
        learner.reply(learned, reply)
        times.append((clock() - t) * 1e3)
    return times


def memory(sessions: int, step: int) -> list[tuple[int, int, dict[str, int]]]:
    """Traced bytes of a learner after every ``step`` sessions of hostile traffic: distinct keys,
    distinct system prompts (one in four sessions), three requests each."""
    rng = random.Random(1)
    base = prose(rng, 200, 5)
    tracemalloc.start()
    learner = TrafficLearner(LearnerConfig())
    before = tracemalloc.get_traced_memory()[0]
    out = []
    for s in range(sessions):
        system = (f"You are agent {_spelled(s // 4)}. " if s % 4 == 0 else "You are the Planner. ") + base
        for turn in range(3):
            body = {"model": "m", "user": f"user-{s}", "messages": [{"role": "system", "content": system}, {
                "role": "user", "content": f"request {s}.{turn} " + base[:200]}]}
            learned = learner.observe(body)
            learner.ended()
            learner.reply(learned, {"content": f"reply {s}.{turn}: " + base[:120]})
        if (s + 1) % step == 0:
            out.append((s + 1, tracemalloc.get_traced_memory()[0] - before, learner.stats()))
    tracemalloc.stop()
    return out


def _spelled(n: int) -> str:
    """``n`` in letters (digits would be masked as dynamic text: every prompt one agent)."""
    return "".join("abcdefghij"[int(d)] for d in str(n))


def row(name: str, samples: list[float]) -> str:
    s = sorted(samples)
    return (f"{name:<12} {len(s):>7} {statistics.fmean(s):9.4f} {s[len(s) // 2]:9.4f} {s[int(len(s) * 0.99)]:9.4f} "
            f"{s[-1]:9.3f}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--sessions", type=int, default=40_000, help="sessions of the memory run")
    p.add_argument("--profile", action="store_true", help="print cProfile's top functions of one more run")
    args = p.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    stream = traffic(args.requests)
    sizes = sorted(len(raw) for raw, _, _ in stream)
    print(f"traffic: {len(stream)} requests of {len({id(s) for _, s, _ in stream})} interleaved sessions; "
          f"body bytes p50 {sizes[len(sizes) // 2]}, max {sizes[-1]}\n")
    parsed = [(json.loads(raw), reply) for raw, _, reply in stream]
    serve(TrafficLearner(), parsed[: len(parsed) // 4])  # warm-up (imports, allocator)
    passes, parses = [], []
    for _ in range(args.passes):
        learner = TrafficLearner()
        passes.append(serve(learner, parsed))
        parse = []
        for raw, _, _ in stream:
            t = time.perf_counter()
            from_json(raw, cache_strings=False)
            parse.append((time.perf_counter() - t) * 1e3)
        parses.append(parse)
    times = [min(ms) for ms in zip(*passes, strict=True)]
    parse = [min(ms) for ms in zip(*parses, strict=True)]
    by_kind: dict[str, list[float]] = {}
    for (_, session, _), ms in zip(stream, times, strict=True):
        by_kind.setdefault(session.kind, []).append(ms)
    print(f"{'per request':<12} {'n':>7} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    print(row("all", times))
    for kind, samples in sorted(by_kind.items()):
        print(row(kind, samples))
    print(row("first pass", passes[0]) + "   <- one pass alone (the machine's noise included)")
    print(row("(parse)", parse) + "   <- the embedded server's second parse of the body")
    print(row("embedded", [a + b for a, b in zip(times, parse, strict=True)]) + "   <- learner + that parse")
    stats = learner.stats()
    print(f"learned: {stats['learned_agents']} agents, {stats['live_sessions']} live sessions, "
          f"{stats['learned_hint_requests']} learned hints\n")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        serve(TrafficLearner(), parsed)
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    step = 10_000
    print(f"memory (tracemalloc, the learner alone; hostile traffic: every session a new key, "
          f"{args.sessions // 4} distinct system prompts):")
    marks = memory(args.sessions, step)
    for sessions, traced, st in marks:
        print(f"  after {sessions:>6} sessions: {traced / 2**20:7.2f} MiB traced; {st['live_sessions']} live "
              f"sessions, {st['learned_agents']} agents")
    mean = statistics.fmean(times)
    full = marks[-2] if len(marks) > 1 else marks[0]
    grew = marks[-1][1] / full[1] if full[1] else float("inf")
    verdicts = [(mean <= TARGET_MS, f"cost: the learner adds {mean:.4f} ms per request (mean over the run, "
                 f"least of {args.passes} passes; target <= {TARGET_MS} ms)"),
                (grew <= 1.05, f"memory: {marks[-1][1] / 2**20:.2f} MiB after {marks[-1][0]} sessions vs "
                 f"{full[1] / 2**20:.2f} MiB after {full[0]} (x{grew:.3f}; bounded: <= x1.05)")]
    print()
    for ok, text in verdicts:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0 if all(ok for ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
