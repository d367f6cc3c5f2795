"""Helpers for benchmarks/sglang_gpu.sh (GPU machine only; stdlib HTTP so it runs in SGLang's env).

    python benchmarks/sglang_gpu_workload.py llama8b-config SMOLLM2_DIR OUT_DIR
    python benchmarks/sglang_gpu_workload.py wait URL SECONDS
    python benchmarks/sglang_gpu_workload.py smoke URL
    python benchmarks/sglang_gpu_workload.py workflow URL --label NAME --out RESULT.json [--hints]
    python benchmarks/sglang_gpu_workload.py report RESULT.json...

The workflow is the paper's synthetic sequential one: 10 agents, each with a fixed prompt of 4,096
tokens, a dynamic part of 32 and an output of 32 tokens; every agent is warmed once, then 3 rounds
are timed end to end. With ``--hints`` every call carries the kvflow hint (steps of all agents:
agent j is ``(j - i) mod 10`` steps away while agent i runs) and the fixed-prefix boundary.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

AGENTS, FIXED, DYNAMIC, OUTPUT, ROUNDS = 10, 4096, 32, 32, 3
LLAMA_8B = {  # Llama-3.1-8B's shape; weights come from --load-format dummy
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 16384, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
}


def _post(url: str, body: dict, timeout: float = 300) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def _get(url: str, timeout: float = 10) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read() or b"{}")


def llama8b_config(smollm2_dir: str, out_dir: str) -> None:
    """An 8B-class Llama directory: SmolLM2's tokenizer files, Llama-3.1-8B's shape, no weights."""
    src, out = Path(smollm2_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json"):
        if (src / name).exists():
            shutil.copy(src / name, out / name)
    small = json.loads((src / "config.json").read_text())
    config = dict(LLAMA_8B, vocab_size=small["vocab_size"], bos_token_id=small.get("bos_token_id"),
                  eos_token_id=small.get("eos_token_id"))
    (out / "config.json").write_text(json.dumps(config, indent=1))


def wait(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5).read()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(2)
    raise SystemExit(f"server at {url} not healthy after {seconds:.0f} s")


def smoke(url: str) -> None:
    """Real text from SmolLM2 through SGLang with the plugin, plus the kvflow routes."""
    hint = {"kvflow": {"workflow_id": "smoke", "agent": "geo", "steps": {"geo": 0}, "fixed_prefix": 1}}
    body = {"model": "default", "max_tokens": 24, "temperature": 0, "custom_params": hint,
            "messages": [{"role": "system", "content": "You are a helpful geography assistant."},
                         {"role": "user", "content": "What is the capital of France?"}]}
    text = _post(f"{url}/v1/chat/completions", body)["choices"][0]["message"]["content"]
    print(f"smoke: {text!r}")
    if "paris" not in text.lower():
        raise SystemExit("smoke: SmolLM2 did not answer Paris")
    info = _get(f"{url}/kvflow/v1/info")
    if info.get("policy") != "kvflow":
        raise SystemExit(f"smoke: /kvflow/v1/info reports {info}")
    bad = dict(body, custom_params={"kvflow": {"agent": "geo", "steps": {"geo": -1}}})
    try:
        _post(f"{url}/v1/chat/completions", bad)
        raise SystemExit("smoke: a bad hint was accepted")
    except urllib.error.HTTPError as exc:
        if exc.code != 400:
            raise SystemExit(f"smoke: a bad hint got HTTP {exc.code}, expected 400") from None
    _post(f"{url}/kvflow/v1/steps", {"workflow_id": "smoke", "done": True})
    print("smoke: stats", json.dumps(_get(f"{url}/kvflow/v1/stats").get("counters")))


def workflow(url: str, label: str, out: str, hints: bool, seed: int = 0) -> None:
    rng = random.Random(seed)
    fixed = [[rng.randrange(1000, 40000) for _ in range(FIXED)] for _ in range(AGENTS)]

    def call(i: int, round_: int) -> None:
        ids = fixed[i] + [rng.randrange(1000, 40000) for _ in range(DYNAMIC)]
        sampling = {"max_new_tokens": OUTPUT, "temperature": 0, "ignore_eos": True}
        if hints:
            steps = {f"agent{j}": (j - i) % AGENTS for j in range(AGENTS)}
            sampling["custom_params"] = {
                "kvflow": {"workflow_id": "bench", "agent": f"agent{i}", "steps": steps},
                "kvflow_fixed_tokens": FIXED,
            }
        reply = _post(f"{url}/generate", {"input_ids": ids, "sampling_params": sampling})
        if reply["meta_info"]["completion_tokens"] != OUTPUT:
            raise SystemExit(f"{label}: agent{i} round {round_} returned {reply['meta_info']}")

    for i in range(AGENTS):  # warm every agent once, as the paper does
        call(i, -1)
    start = time.perf_counter()
    for round_ in range(ROUNDS):
        for i in range(AGENTS):
            call(i, round_)
    seconds = time.perf_counter() - start
    stats = {}
    if hints:
        stats = _get(f"{url}/kvflow/v1/stats").get("counters", {})
    Path(out).write_text(json.dumps({"label": label, "seconds": seconds, "calls": ROUNDS * AGENTS, "kvflow": stats}))
    print(f"{label}: {seconds:.2f} s for {ROUNDS * AGENTS} calls {stats or ''}")


def report(paths: list[str]) -> None:
    runs = {r["label"]: r["seconds"] for r in (json.loads(Path(p).read_text()) for p in paths)}
    print("\nend-to-end time, synthetic workflow (10 agents, fixed 4096, dynamic 32, output 32, 3 rounds):")
    for label, seconds in runs.items():
        print(f"  {label:<14} {seconds:8.2f} s")
    for base in ("stock-lru", "stock-hicache"):
        if base in runs and "kvflow" in runs:
            print(f"  speedup kvflow vs {base}: {runs[base] / runs['kvflow']:.2f}x")
    if "stock-lru" in runs and "stock-hicache" in runs:
        print(f"  speedup stock-hicache vs stock-lru: {runs['stock-lru'] / runs['stock-hicache']:.2f}x")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("llama8b-config")
    p.add_argument("smollm2_dir")
    p.add_argument("out_dir")
    p = sub.add_parser("wait")
    p.add_argument("url")
    p.add_argument("seconds", type=float)
    p = sub.add_parser("smoke")
    p.add_argument("url")
    p = sub.add_parser("workflow")
    p.add_argument("url")
    p.add_argument("--label", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hints", action="store_true")
    p = sub.add_parser("report")
    p.add_argument("results", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "llama8b-config":
        llama8b_config(args.smollm2_dir, args.out_dir)
    elif args.cmd == "wait":
        wait(args.url, args.seconds)
    elif args.cmd == "smoke":
        smoke(args.url)
    elif args.cmd == "workflow":
        workflow(args.url, args.label, args.out, args.hints)
    else:
        report(args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
