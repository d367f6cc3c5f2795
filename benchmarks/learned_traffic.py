"""Learned hints vs LRU on the embedded engine, plain OpenAI traffic (issue 23's no-harm target, and
what learning buys on agentic traffic), side by side in one run.

    python benchmarks/learned_traffic.py [--model tiny-random] [--device-tokens 2048] [--out DIR]

Two ``kvflow serve`` servers, the same model and pool (below every stream's working set), one
``--no-learned-hints`` (the brain sees no hint: its LRU order) and one ``--learned-hints``; each
stream is sent to both, one request at a time, greedy, no hints, no session keys:

* ``random``: ``vllm bench serve``'s random dataset in spirit: prompts of random words (random
  lengths), no shared prefix, one request per conversation (non-agentic: the no-harm case);
* ``long-chat``: one conversation of ``--chat-turns`` turns, each request carrying the whole
  history (the no-harm case: a single session);
* ``supervisor``: interleaved supervisor/worker sessions (a supervisor, three workers, the whole
  conversation on every request), the agentic case.

Per stream: the prompt-token hit ratio (``usage.prompt_tokens_details.cached_tokens`` over prompt
tokens), requests per second, and whether every greedy reply was the same on both servers (the
outputs must not depend on the cache). No harm: on ``random`` and ``long-chat``, learned's hit
ratio within 2 points of LRU's and its throughput within 2% (throughput on a shared 2-core machine
is noisy: it is printed, the verdict is on hit ratio). The streams themselves are written to
``--out`` (``streams.jsonl``: the exact bodies sent) so the run can be replayed.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Iterator

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from backends.vllm_kvflow.launcher import running  # the generic "start, wait for /health, stop" helper

ROOT = Path(__file__).resolve().parent.parent
MODEL = ["tiny-random"]  # the served model's name (--model), set once in main

WORDS = ("tide mill river stone wheel grain flour water gate sluice ebb flow miller sack cart road town market "
         "price coin ledger clerk harbor ship sail rope anchor storm wind").split()
ROLES = ("the Supervisor. Route each task to the right worker and finish when the work is done.",
         "a Research Analyst. Find the facts the supervisor asks for and cite them.",
         "a Python Coder. Write the code the supervisor asks for.",
         "a Technical Writer. Turn the findings into a short clear report.")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def random_stream(rng: random.Random, n: int) -> Iterator[list[dict]]:
    for _ in range(n):
        yield [{"role": "user", "content": words(rng, rng.randint(60, 240))}]


class Conversation:
    def __init__(self, first: str) -> None:
        self.turns = [{"role": "user", "content": first}]


def long_chat(rng: random.Random, turns: int) -> Iterator[tuple[list[dict], Conversation]]:
    chat = Conversation(words(rng, 40))
    system = {"role": "system", "content": "You are a helpful assistant. " + words(rng, 60)}
    for _ in range(turns):
        yield [system, *chat.turns], chat


def supervisor_stream(rng: random.Random, sessions: int, rounds: int) -> Iterator[tuple[list[dict], Conversation]]:
    systems = [{"role": "system", "content": f"You are {role} " + words(random.Random(i), 150)}
               for i, role in enumerate(ROLES)]
    live = [(Conversation(f"Task {s}: " + words(rng, 30)), iter(_plan(rng, rounds))) for s in range(sessions)]
    while live:
        i = rng.randrange(len(live))
        chat, plan = live[i]
        agent = next(plan, None)
        if agent is None:
            live.pop(i)
            continue
        yield [systems[agent], *chat.turns], chat


def _plan(rng: random.Random, rounds: int) -> list[int]:
    out = []
    for _ in range(rounds):
        out += [0, rng.choice((1, 1, 2, 3))]
    return [*out, 0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(stack: ExitStack, args: argparse.Namespace, learned: bool, out: Path) -> str:
    port = free_port()
    argv = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", args.model, "--port", str(port),
            "--device-tokens", str(args.device_tokens), "--host-tokens", "0",
            "--learned-hints" if learned else "--no-learned-hints"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    log = out / f"server-{'learned' if learned else 'lru'}.log"
    return stack.enter_context(running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=ROOT, timeout_s=600))


def send(client: httpx.Client, url: str, messages: list[dict], max_tokens: int) -> tuple[str, int, int]:
    r = client.post(url + "/v1/chat/completions", json={"model": MODEL[0], "messages": messages, "temperature": 0,
                                                         "max_tokens": max_tokens})
    r.raise_for_status()
    data = r.json()
    usage = data["usage"]
    return (data["choices"][0]["message"]["content"] or "", usage["prompt_tokens"],
            (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def run_stream(name: str, items: list, urls: dict[str, str], max_tokens: int, record) -> dict:
    """Each request to both servers in turn (LRU first, then learned); the conversation goes on with
    the LRU server's reply (both are greedy: the replies must be equal)."""
    totals = {k: {"prompt": 0, "cached": 0, "seconds": 0.0} for k in urls}
    same = True
    with httpx.Client(timeout=600) as client:
        for messages, chat in items:
            record({"stream": name, "messages": messages})
            replies = {}
            for key, url in urls.items():
                t = time.perf_counter()
                replies[key], prompt, cached = send(client, url, messages, max_tokens)
                totals[key]["seconds"] += time.perf_counter() - t
                totals[key]["prompt"] += prompt
                totals[key]["cached"] += cached
            same &= len(set(replies.values())) == 1
            if chat is not None:
                chat.turns.append({"role": "assistant", "content": replies["lru"]})
                chat.turns.append({"role": "user", "content": "Go on: " + " ".join(replies["lru"].split()[:8])})
    return {"requests": len(items), "same_outputs": same, **{
        k: {"hit_ratio": t["cached"] / t["prompt"] if t["prompt"] else 0.0,
            "rps": len(items) / t["seconds"] if t["seconds"] else 0.0, **t} for k, t in totals.items()}}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny-random")
    p.add_argument("--device-tokens", type=int, default=2048)
    p.add_argument("--random-requests", type=int, default=60)
    p.add_argument("--chat-turns", type=int, default=24)
    p.add_argument("--sessions", type=int, default=6)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learned-traffic")
    args = p.parse_args()
    MODEL[0] = args.model
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  uptime: "
          f"{subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}")
    print(f"model {args.model}, device pool {args.device_tokens} tokens, host tier off, greedy, "
          f"max_tokens {args.max_tokens}\n")
    rng = random.Random(0)
    streams = {"random": [(m, None) for m in random_stream(rng, args.random_requests)]}
    results = {}
    with ExitStack() as stack, open(args.out / "streams.jsonl", "w") as recorded:
        urls = {"lru": serve(stack, args, False, args.out), "learned": serve(stack, args, True, args.out)}

        def record(item: dict) -> None:
            recorded.write(json.dumps(item) + "\n")

        results["random"] = run_stream("random", streams["random"], urls, args.max_tokens, record)
        results["long-chat"] = run_stream("long-chat", list(long_chat(rng, args.chat_turns)), urls, args.max_tokens,
                                          record)
        results["supervisor"] = run_stream("supervisor", list(supervisor_stream(rng, args.sessions, args.rounds)),
                                           urls, args.max_tokens, record)
        learner = httpx.get(urls["learned"] + "/kvflow/v1/stats", timeout=60).json()["learner"]
    print(f"{'stream':<12} {'requests':>8} {'LRU hit':>8} {'learned hit':>11} {'LRU req/s':>10} "
          f"{'learned req/s':>13} {'same outputs':>12}")
    for name, r in results.items():
        print(f"{name:<12} {r['requests']:>8} {r['lru']['hit_ratio']:>8.1%} {r['learned']['hit_ratio']:>11.1%} "
              f"{r['lru']['rps']:>10.2f} {r['learned']['rps']:>13.2f} {str(r['same_outputs']):>12}")
    print(f"\nlearner on the learned server: {json.dumps(learner)}")
    verdicts = []
    for name in ("random", "long-chat"):
        r = results[name]
        gap = r["learned"]["hit_ratio"] - r["lru"]["hit_ratio"]
        verdicts.append((gap >= -0.02, f"no harm, {name}: learned hit ratio {r['learned']['hit_ratio']:.1%} vs LRU "
                                       f"{r['lru']['hit_ratio']:.1%} ({gap:+.1%}; target >= -2 points)"))
    verdicts.append((all(r["same_outputs"] for r in results.values()),
                     "greedy outputs identical with and without learned hints"))
    print()
    for ok, text in verdicts:
        print(f"  {'PASS' if ok else 'FAIL'}  {text}")
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0 if all(ok for ok, _ in verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
