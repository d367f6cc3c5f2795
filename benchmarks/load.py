"""Load test of ``kvflow serve``: concurrent workflows + plain OpenAI traffic + a hint flood,
then the integrity checks. Loopback only, bounded in count and time.

For each N in ``--levels`` (default 1, 8, 32, 64) N workflows run at once through the runtime's HTTP
client (alternating ``workflows.metagpt`` and ``workflows.map_reduce``, two namespaces), while a
stream of plain chat completions without hints runs beside them. The tiny-random model serves; the
device pool holds a fraction of the working set (the MetaGPT role prompts alone are ~18k tokens;
default device pool 8,192), the host tier holds all of it. Per level: throughput (LLM calls/s,
output tokens/s), p50/p99 latency per call, the cache counters moved, and after the level: nothing
held by a request (slots, queue places, locks, loads), ``check_integrity()`` true (debug route),
no workflow left in the hint table once every workflow sent ``done``, and no error.

Then the full hint flood: one client offers 10,000 steps updates per second for 5 s (pipelined on a
few connections) while another measures chat latency; the hint table must stay bounded. Last, the
probe requests must give exactly the greedy outputs of a fresh server (started first, same seed).

    python benchmarks/load.py [--levels 1,8,32,64] [--device-tokens 8192] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator, NamedTuple

import httpx

from kvflow_orch import arun
from kvflow_orch.clients import HttpClient, HttpConfig
from workflows.map_reduce import map_reduce
from workflows.metagpt import metagpt
from workflows.metagpt_roles import ARCHITECT, QA_ENGINEER

DEBUG = "/kvflow/v1/debug"
HELD_KEYS = ("device_held", "running", "waiting", "loads_in_flight")
COUNTERS = ("device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens", "recomputed_tokens",
            "prefetched_tokens", "evicted_device_tokens", "evicted_host_tokens")


# ---------------------------------------------------------------- server process
@contextmanager
def kvflow_serve(args: argparse.Namespace) -> Iterator[tuple[str, int]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", "tiny-random", "--port", str(port),
           "--device-tokens", str(args.device_tokens), "--host-tokens", str(args.host_tokens),
           "--policy", "kvflow", "--debug-routes"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"kvflow serve did not start: {' '.join(cmd)}")
            time.sleep(0.2)
        yield url, proc.pid
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


# ---------------------------------------------------------------- probes
def probe_bodies(max_tokens: int) -> list[tuple[str, dict[str, Any]]]:
    """Prompts that hit what the load left in the cache (role prompts, on device or host) and cold ones."""
    chat = [[{"role": "system", "content": system}, {"role": "user", "content": user}]
            for system, user in ((ARCHITECT, "Design a chat server."), (QA_ENGINEER, "Review: print('hi')"),
                                 ("You are terse.", "Name three colours."))]
    bodies = [("/v1/chat/completions", {"messages": m, "max_tokens": max_tokens, "temperature": 0}) for m in chat]
    ids = [(i * 31 + 7) % 250 for i in range(600)]
    sampling = {"max_new_tokens": max_tokens, "ignore_eos": True, "temperature": 0}
    bodies += [("/generate", {"input_ids": ids[:n], "sampling_params": sampling}) for n in (600, 300)]
    return bodies


def run_probes(url: str, max_tokens: int) -> list[Any]:
    out = []
    with httpx.Client(base_url=url, timeout=120) as client:
        for path, body in probe_bodies(max_tokens) * 2:  # twice: the second pass hits the cache
            data = client.post(path, json=body).raise_for_status().json()
            out.append(data["output_ids"] if path == "/generate" else data["choices"][0]["message"]["content"])
    return out


# ---------------------------------------------------------------- one load level
class Level(NamedTuple):
    n: int
    wall_s: float
    calls: int
    plain_calls: int
    out_tokens: int
    p50_ms: float
    p99_ms: float
    plain_p99_ms: float
    errors: int
    counters: dict[str, int]
    held_after: dict[str, int]
    integrity: dict[str, Any]
    hint_workflows_after: int


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _plain_stream(url: str, stop: asyncio.Event, max_tokens: int, latencies: list[float]) -> int:
    errors = 0
    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        i = 0
        while not stop.is_set():
            body = {"messages": [{"role": "system", "content": f"You answer question {i % 7} briefly."},
                                 {"role": "user", "content": f"Plain request {i}."}], "max_tokens": max_tokens}
            t0 = time.perf_counter()
            response = await client.post("/v1/chat/completions", json=body)
            latencies.append(time.perf_counter() - t0)
            errors += response.status_code != 200
            i += 1
            await asyncio.sleep(0.05)
    return errors


class Shapes(NamedTuple):
    metagpt: Any
    map_reduce: Any


PLAIN_STREAMS = 2  # concurrent clients sending plain chat completions (no hints) during every level


def _workflow_inputs(i: int, shapes: Shapes) -> tuple[Any, dict[str, Any], str]:
    if i % 2 == 0:
        return shapes.metagpt, {"idea": f"tool number {i} for tracking team tasks"}, "team-metagpt"
    text = " ".join(f"fact{i}-{k} grows by {k * 3} percent" for k in range(40))
    return shapes.map_reduce, {"text": text}, "team-mapreduce"


async def _settle(client: httpx.AsyncClient, timeout_s: float = 60) -> tuple[dict[str, Any], dict[str, int]]:
    deadline = time.monotonic() + timeout_s
    while True:
        stats = (await client.get("/kvflow/v1/stats")).json()
        held = {k: int(stats[k]) for k in HELD_KEYS}
        if not any(held.values()) or time.monotonic() > deadline:
            return stats, held
        await asyncio.sleep(0.1)


async def run_level(url: str, n: int, shapes: Shapes, args: argparse.Namespace) -> Level:
    async with httpx.AsyncClient(base_url=url, timeout=60) as admin:
        before = (await admin.get("/kvflow/v1/stats")).json()
        llm = HttpClient(url, HttpConfig(read_timeout_s=args.level_timeout))
        stop, plain_lat = asyncio.Event(), []
        plain = asyncio.gather(*(_plain_stream(url, stop, args.max_tokens, plain_lat) for _ in range(PLAIN_STREAMS)))
        t0 = time.perf_counter()
        runs = []
        for i in range(n):
            wf, inputs, ns = _workflow_inputs(i, shapes)
            runs.append(arun(wf, inputs, backend=llm, namespace=ns, workflow_id=f"load-{n}-{i}"))
        results = await asyncio.wait_for(asyncio.gather(*runs, return_exceptions=True), args.level_timeout)
        wall = time.perf_counter() - t0
        stop.set()
        plain_errors = sum(await plain)
        await llm.aclose()  # delivers the pending done=true updates
        errors = [r for r in results if isinstance(r, BaseException)]
        for err in errors[:3]:
            print(f"  workflow error: {err!r}", file=sys.stderr)
        calls = [c for r in results if not isinstance(r, BaseException) for c in r.calls]
        after, held = await _settle(admin)
        integrity = (await admin.get(f"{DEBUG}/integrity")).json()
        hints = (await admin.get(f"{DEBUG}/hints")).json()
    return Level(
        n=n, wall_s=wall, calls=len(calls), plain_calls=len(plain_lat),
        out_tokens=sum(c.completion_tokens for c in calls),
        p50_ms=_pct([c.duration_s for c in calls], 0.50), p99_ms=_pct([c.duration_s for c in calls], 0.99),
        plain_p99_ms=_pct(plain_lat, 0.99), errors=len(errors) + plain_errors,
        counters={k: int(after[k]) - int(before[k]) for k in COUNTERS}, held_after=held,
        integrity=integrity, hint_workflows_after=int(hints["workflows"]),
    )


# ---------------------------------------------------------------- hint flood
class Flood(NamedTuple):
    offered: int
    seconds: float
    answered: int
    answer_seconds: float
    others_sent: int
    others_ok: int
    others_p99_ms: float
    hint_workflows: int
    hint_entries: int
    hint_workflows_after_done: int
    rss_before_mb: float
    rss_after_mb: float


FLOOD_CONNECTIONS = 4
FLOOD_WORKFLOWS = 250  # per connection; each is updated again and again: updates replace, memory must not grow


def _rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmRSS:")) / 1024


async def _flood_connection(url: str, rate: float, seconds: float, conn: int, answered: list[float]) -> int:
    """Offer ``rate`` updates/s for ``seconds`` on one connection, pipelined (no waiting for answers);
    ``answered`` gets [count of 200s, time of the last one]."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = 0

    async def read_all() -> None:
        tail = b""
        while chunk := await reader.read(65536):
            data = tail + chunk
            tail = data[-16:]  # a status line split across reads is counted once, in the next read
            new = data.count(b"HTTP/1.1 200") - tail.count(b"HTTP/1.1 200")
            if new:
                answered[0] += new
                answered[1] = time.perf_counter()

    reading = asyncio.ensure_future(read_all())
    t0 = time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < seconds:
        for _ in range(max(0, int(elapsed * rate) - sent)):
            body = json.dumps({"workflow_id": f"flood-{conn}-{sent % FLOOD_WORKFLOWS}", "namespace": "flood",
                               "steps": {"a": sent % 5, "b": 1, "c": None}}).encode()
            writer.write(b"POST /kvflow/v1/steps HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            sent += 1
        await writer.drain()
        await asyncio.sleep(0.005)
    last = -1.0
    while answered[0] != last:  # until the server has stopped answering for a second (or 60 s)
        last = answered[0]
        await asyncio.sleep(1.0)
        if time.perf_counter() - t0 > seconds + 60:
            break
    reading.cancel()
    writer.close()
    return sent


async def run_flood(url: str, pid: int, args: argparse.Namespace) -> Flood:
    answered = [0.0, 0.0]
    latencies: list[float] = []
    ok = 0
    rss_before = _rss_mb(pid)

    async def others(client: httpx.AsyncClient) -> None:
        nonlocal ok
        t_end = time.perf_counter() + args.flood_seconds
        while time.perf_counter() < t_end:
            t0 = time.perf_counter()
            r = await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "still there?"}], "max_tokens": args.max_tokens})
            latencies.append(time.perf_counter() - t0)
            ok += r.status_code == 200
            await asyncio.sleep(0.1)

    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        t0 = time.perf_counter()
        rate = args.flood_rate / FLOOD_CONNECTIONS
        *sent, _ = await asyncio.gather(*(_flood_connection(url, rate, args.flood_seconds, c, answered)
                                          for c in range(FLOOD_CONNECTIONS)),
                                        others(client))
        hints = (await client.get(f"{DEBUG}/hints")).json()
        rss_after = _rss_mb(pid)
        for c in range(FLOOD_CONNECTIONS):  # end the flood's workflows, as a well-behaved client would
            for w in range(FLOOD_WORKFLOWS):
                await client.post("/kvflow/v1/steps", json={"workflow_id": f"flood-{c}-{w}", "namespace": "flood",
                                                            "done": True})
        after_done = (await client.get(f"{DEBUG}/hints")).json()["workflows"]
    return Flood(sum(sent), args.flood_seconds, int(answered[0]), max(answered[1] - t0, 1e-9), len(latencies), ok,
                 _pct(latencies, 0.99), hints["workflows"], hints["entries"], after_done, rss_before, rss_after)


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32,64")
    parser.add_argument("--device-tokens", type=int, default=8192)
    parser.add_argument("--host-tokens", type=int, default=65536)
    parser.add_argument("--max-tokens", type=int, default=32, help="reply length of every call")
    parser.add_argument("--level-timeout", type=float, default=300.0)
    parser.add_argument("--flood-rate", type=float, default=10_000.0)
    parser.add_argument("--flood-seconds", type=float, default=5.0)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    args = parser.parse_args(argv)
    shapes = Shapes(metagpt(fix_rounds=2, max_tokens=args.max_tokens), map_reduce(n=4, max_tokens=args.max_tokens))
    levels = [int(x) for x in args.levels.split(",")]
    t_start = time.perf_counter()
    with kvflow_serve(args) as (url, _):
        fresh = run_probes(url, args.max_tokens)
    with kvflow_serve(args) as (url, pid):
        rows = []
        for n in levels:
            row = asyncio.run(run_level(url, n, shapes, args))
            rows.append(row)
            print(f"N={n:3d}  {row.calls / row.wall_s:6.1f} calls/s  {row.out_tokens / row.wall_s:7.1f} tok/s  "
                  f"p50 {row.p50_ms:7.1f} ms  p99 {row.p99_ms:7.1f} ms  plain p99 {row.plain_p99_ms:7.1f} ms  "
                  f"calls {row.calls} (+{row.plain_calls} plain)  errors {row.errors}  wall {row.wall_s:5.1f} s",
                  flush=True)
            print(f"       held after {row.held_after}  integrity {row.integrity}  "
                  f"hint workflows after done {row.hint_workflows_after}", flush=True)
            print(f"       counters {row.counters}", flush=True)
        flood = asyncio.run(run_flood(url, pid, args)) if args.flood_seconds > 0 else None
        if flood is not None:
            print(f"flood: offered {flood.offered} steps updates in {flood.seconds:.1f} s "
                  f"({flood.offered / flood.seconds:.0f}/s); server answered {flood.answered} "
                  f"({flood.answered / flood.answer_seconds:.0f}/s); "
                  f"other client: {flood.others_ok}/{flood.others_sent} chats ok, p99 {flood.others_p99_ms:.1f} ms; "
                  f"hint table at the end {flood.hint_workflows} workflows / "
                  f"{flood.hint_entries} entries, after done {flood.hint_workflows_after_done}; server RSS "
                  f"{flood.rss_before_mb:.0f} -> {flood.rss_after_mb:.0f} MB", flush=True)
        loaded = run_probes(url, args.max_tokens)
    same = loaded == fresh
    print(f"probes: {len(fresh)} requests, outputs identical to a fresh server: {same}")
    flood_ok = flood is None or (flood.hint_workflows_after_done == 0 and flood.others_ok == flood.others_sent)
    ok = same and flood_ok and all(r.errors == 0 and not any(r.held_after.values()) and r.integrity.get("ok")
                                   and r.integrity.get("locked_nodes") == 0 and r.hint_workflows_after == 0
                                   for r in rows)
    print(f"total {time.perf_counter() - t_start:.0f} s; all checks {'passed' if ok else 'FAILED'}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"levels": [r._asdict() for r in rows], "flood": flood._asdict() if flood else None,
                       "probes_identical": same, "ok": ok}, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
