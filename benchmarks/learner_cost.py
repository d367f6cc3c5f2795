"""What the traffic learner adds per request, and its memory at 10,000 sessions (issue 23's cost target).

    flock /tmp/kvflow-timing.lock python benchmarks/learner_cost.py [--requests 6000] [--baseline main] [--profile]

Framework-shaped plain traffic, as it reaches a host's chat route (a JSON body, no hint, no session
key), with the sizes the framework apps of ``tests/frameworks`` send:

* ``supervisor``: a langgraph-supervisor app: a supervisor and three workers, each with a ~1.5 kB
  system prompt carrying the date and 3-4 tools with JSON schemas; every request carries the whole
  conversation so far (up to ~40 messages, tool calls and results included);
* ``crew``: a CrewAI crew: each agent's own short conversation, the previous task's output carried
  in its prompt (session linking by carried reply lines);
* ``chat``: one long chat, 120 turns (the conversation grows to ~240 messages).

32 sessions run interleaved as concurrent users send them. A request's cost is what a host pays for
the learner on it, measured two ways, each request through every variant in turn (so that the
machine's noise falls on all of them alike):

* **the learner alone**: ``observe``, ``ended`` and ``reply`` on the body as JSON (what the vLLM and
  SGLang hosts pay: they have the body parsed already);
* **the embedded server's path**, as ``kvflow serve`` runs it: the route validates the body
  (``backends.server.serving.validated_json``: parsed once, the model validated from it) and hands
  the same JSON object and the request's headers (those the OpenAI Python SDK sends) to
  ``backends.server.learning.learned_hint``; the reply goes to ``learned_reply``. The learner's cost
  there is that path less the validation alone (which the route does with the learner off too).

``--baseline REF`` (default ``main``) imports ``backends/learn`` as of that git ref beside this tree's
and runs it through the path as it was then (the body validated as bytes, then parsed a second time
for the learner, Starlette's ``Headers`` read for the session keys): before and after, side by side
in one run. The stream is replayed ``--passes`` times, each on fresh learners (the same decisions
each time), and a request's cost is its least time over the passes: the machine is shared, and a
slice lost to another process is no cost of the learner's. The figure the target applies to is
the mean of that over the run, solves included (p50, p99 and max beside it).

Then memory: ``tracemalloc`` over the learner alone (its default bounds: 10,000 live sessions) while
40,000 sessions with distinct keys arrive, one in four with a system prompt of its own (hostile
fingerprints). Traced memory is printed at every 10,000 sessions; once every bound is reached (the
content index's 65,536 entries fill last, by about 30,000) it must stay flat: the last figure
within 5% of the one before.
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.util
import io
import json
import os
import pstats
import random
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any, Callable, Iterator

from pydantic_core import from_json
from starlette.requests import Request

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.learn import LearnerConfig, TrafficLearner
from backends.local import Engine, EngineConfig
from backends.server.learning import learned_hint, learned_reply
from backends.server.limits import ServerLimits
from backends.server.openai_models import ChatCompletionRequest
from backends.server.serving import ServerContext, validated_json

ROOT = Path(__file__).resolve().parent.parent
TARGET_MS = 0.1
SDK_HEADERS = [(k.encode(), v.encode()) for k, v in (
    ("host", "127.0.0.1:8000"), ("accept-encoding", "gzip, deflate"), ("connection", "keep-alive"),
    ("accept", "application/json"), ("content-type", "application/json"), ("user-agent", "OpenAI/Python 1.99.9"),
    ("x-stainless-lang", "python"), ("x-stainless-package-version", "1.99.9"), ("x-stainless-os", "Linux"),
    ("x-stainless-arch", "x64"), ("x-stainless-runtime", "CPython"), ("x-stainless-runtime-version", "3.11.7"),
    ("authorization", "Bearer sk-local"), ("x-stainless-async", "false"), ("x-stainless-retry-count", "0"),
    ("x-stainless-read-timeout", "600"), ("content-length", "10474"))]
"""What the OpenAI Python SDK sends with a chat request (none of them a session key)."""
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
    """The learner's part of every request, in ms (``--profile``'s run)."""
    times = []
    clock = time.perf_counter
    for body, reply in stream:
        t = clock()
        learned = learner.observe(body, route="chat")
        learner.ended()
        learner.reply(learned, reply)
        times.append((clock() - t) * 1e3)
    return times


Variant = Callable[[bytes, dict, dict], None]


def alone(learner: Any) -> Variant:
    """The learner alone on the parsed body (the vLLM and SGLang hosts' share)."""
    def run(raw: bytes, body: dict, reply: dict) -> None:
        learned = learner.observe(body, route="chat")
        learner.ended()
        learner.reply(learned, reply)
    return run


def embedded(ctx: ServerContext) -> Variant:
    """The embedded server's route as it is: one parse, then the learner on the same JSON object."""
    def run(raw: bytes, body: dict, reply: dict) -> None:
        request = Request({"type": "http", "headers": SDK_HEADERS})
        validated, data = validated_json(raw, ChatCompletionRequest)
        _, learned = learned_hint(request, ctx, "chat", data, None)
        learned_reply(ctx, learned, reply)
    return run


def embedded_before(learner: Any, engine: Engine) -> Variant:
    """The embedded server's route as it was at ``--baseline``: the body validated as bytes, parsed
    a second time for the learner, the session headers read through Starlette's ``Headers``."""
    def run(raw: bytes, body: dict, reply: dict) -> None:
        request = Request({"type": "http", "headers": SDK_HEADERS})
        ChatCompletionRequest.model_validate_json(raw)
        learned = learner.observe(from_json(raw, cache_strings=False), route="chat", headers=request.headers)
        for update in learner.ended():
            engine.apply_steps(update)
        learner.reply(learned, reply)
    return run


def validation(parse: Callable[[bytes], Any]) -> Variant:
    def run(raw: bytes, body: dict, reply: dict) -> None:
        parse(raw)
    return run


def baseline_learner(ref: str) -> type | None:
    """``TrafficLearner`` as of git ``ref``, imported beside this tree's (None where git has no ``ref``)."""
    done = subprocess.run(["git", "archive", ref, "backends/learn"], cwd=ROOT, capture_output=True)
    if done.returncode != 0:
        print(f"--baseline {ref}: {done.stderr.decode().strip()}; no before figures")
        return None
    where = Path(tempfile.mkdtemp(prefix="learner-baseline-"))
    tarfile.open(fileobj=io.BytesIO(done.stdout)).extractall(where, filter="data")
    spec = importlib.util.spec_from_file_location("_baseline_learn", where / "backends/learn/__init__.py",
                                                  submodule_search_locations=[str(where / "backends/learn")])
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.TrafficLearner


def measure(stream: list[tuple[bytes, dict, dict]], variants: Callable[[], dict[str, Variant]],
            passes: int) -> dict[str, list[float]]:
    """Per variant, every request's least time over ``passes`` (ms); each pass on fresh variants,
    each request through all of them in turn, in a rotating order."""
    clock = time.perf_counter
    best: dict[str, list[float]] = {}
    for _ in range(passes):
        runs = variants()
        for name in runs:
            best.setdefault(name, [float("inf")] * len(stream))
        order = list(runs.items())
        for i, (raw, body, reply) in enumerate(stream):
            k = i % len(order)  # each variant takes each place in turn: none always meets the body first
            for name, run in order[k:] + order[:k]:
                t = clock()
                run(raw, body, reply)
                ms = (clock() - t) * 1e3
                if ms < best[name][i]:
                    best[name][i] = ms
    return best


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


def row(name: str, samples: list[float], note: str = "") -> str:
    s = sorted(samples)
    return (f"{name:<22} {len(s):>6} {statistics.fmean(s):9.4f} {s[len(s) // 2]:9.4f} {s[int(len(s) * 0.99)]:9.4f} "
            f"{s[-1]:9.3f}" + (f"   <- {note}" if note else ""))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=6000)
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--baseline", default="main", metavar="REF",
                   help="git ref whose backends/learn runs beside this tree's ('' for none)")
    p.add_argument("--sessions", type=int, default=40_000, help="sessions of the memory run")
    p.add_argument("--profile", action="store_true", help="print cProfile's top functions of one more run")
    args = p.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  python {sys.version.split()[0]}, {os.cpu_count()} CPUs")
    print(f"uptime: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    print(f"this tree: {head.stdout.strip()} (+ uncommitted changes if any); baseline: {args.baseline or 'none'}")
    stream = traffic(args.requests)
    sizes = sorted(len(raw) for raw, _, _ in stream)
    print(f"traffic: {len(stream)} requests of {len({id(s) for _, s, _ in stream})} interleaved sessions; "
          f"body bytes p50 {sizes[len(sizes) // 2]}, max {sizes[-1]}\n")
    parsed = [(raw, json.loads(raw), reply) for raw, _, reply in stream]
    Before = baseline_learner(args.baseline) if args.baseline else None
    engine = Engine(EngineConfig.build(model="tiny-random"))
    limits, names = ServerLimits(), frozenset({engine.model_name})

    def variants() -> dict[str, Variant]:
        out = {"alone": alone(TrafficLearner()),
               "validation now": validation(lambda raw: validated_json(raw, ChatCompletionRequest)),
               "embedded": embedded(ServerContext(engine, limits, names, learner=TrafficLearner()))}
        if Before is not None:
            out |= {"alone before": alone(Before()),
                    "validation before": validation(ChatCompletionRequest.model_validate_json),
                    "embedded before": embedded_before(Before(), engine)}
        return out

    measure(parsed[: len(parsed) // 4], variants, 1)  # warm-up (imports, allocator)
    best = measure(parsed, variants, args.passes)
    engine.close()
    cost = {"now": [a - b for a, b in zip(best["embedded"], best["validation now"], strict=True)]}
    print(f"{'per request':<22} {'n':>6} {'mean ms':>9} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    print(row("alone", best["alone"], "the learner alone (vLLM, SGLang hosts)"))
    by_kind: dict[str, list[float]] = {}
    for (_, session, _), ms in zip(stream, best["alone"], strict=True):
        by_kind.setdefault(session.kind, []).append(ms)
    for kind, samples in sorted(by_kind.items()):
        print(row(f"  {kind}", samples))
    print(row("validation now", best["validation now"], "the route's parse, learner on or off"))
    print(row("embedded", best["embedded"], "the route's parse + learned_hint + learned_reply"))
    print(row("embedded - validation", cost["now"], "the learner's cost on kvflow serve"))
    if Before is not None:
        cost["before"] = [a - b for a, b in zip(best["embedded before"], best["validation before"], strict=True)]
        print(f"\nbefore ({args.baseline}'s learner, the route's path as it was):")
        print(row("alone before", best["alone before"]))
        print(row("validation before", best["validation before"], "validated as bytes"))
        print(row("embedded before", best["embedded before"], "+ second parse, Headers, the learner"))
        print(row("embedded - validation", cost["before"], "the learner's cost on kvflow serve then"))
        pairs = [("learner alone", statistics.fmean(best["alone before"]), statistics.fmean(best["alone"])),
                 ("on kvflow serve", statistics.fmean(cost["before"]), statistics.fmean(cost["now"])),
                 ("the route's validation", statistics.fmean(best["validation before"]),
                  statistics.fmean(best["validation now"]))]
        print("\nside by side (means): " + "; ".join(f"{what} {a:.4f} -> {b:.4f} ms (x{b / a:.3f})"
                                                     for what, a, b in pairs))
    print()
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        serve(TrafficLearner(), [(body, reply) for _, body, reply in parsed])
        prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(14)
    step = 10_000
    print(f"memory (tracemalloc, the learner alone; hostile traffic: every session a new key, "
          f"{args.sessions // 4} distinct system prompts):")
    marks = memory(args.sessions, step)
    for sessions, traced, st in marks:
        print(f"  after {sessions:>6} sessions: {traced / 2**20:7.2f} MiB traced; {st['live_sessions']} live "
              f"sessions, {st['learned_agents']} agents")
    mean, alone_mean = statistics.fmean(cost["now"]), statistics.fmean(best["alone"])
    full = marks[-2] if len(marks) > 1 else marks[0]
    grew = marks[-1][1] / full[1] if full[1] else float("inf")
    verdicts = [(mean <= TARGET_MS, f"cost on kvflow serve: the learner adds {mean:.4f} ms per request (mean over the "
                 f"run, least of {args.passes} passes; target <= {TARGET_MS} ms)"),
                (alone_mean <= TARGET_MS, f"cost on the vLLM and SGLang hosts: {alone_mean:.4f} ms per request "
                 f"(the learner alone; target <= {TARGET_MS} ms)"),
                (grew <= 1.05, f"memory: {marks[-1][1] / 2**20:.2f} MiB after {marks[-1][0]} sessions vs "
                 f"{full[1] / 2**20:.2f} MiB after {full[0]} (x{grew:.3f}; bounded: <= x1.05)")]
    print()
    for ok, text in verdicts:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    print(f"uptime after: {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    return 0 if all(ok for ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
