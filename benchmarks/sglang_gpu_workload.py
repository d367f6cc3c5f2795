"""Helpers for benchmarks/sglang_gpu.sh (GPU machine only; stdlib HTTP so it runs in SGLang's env).

    python3 benchmarks/sglang_gpu_workload.py check-plugin
    python3 benchmarks/sglang_gpu_workload.py llama8b-config SMOLLM2_DIR OUT_DIR
    python3 benchmarks/sglang_gpu_workload.py wait URL SECONDS [--pid PID]
    python3 benchmarks/sglang_gpu_workload.py smoke URL
    python3 benchmarks/sglang_gpu_workload.py workflow URL --label NAME --run N --out RESULT.json [--hints]
    python3 benchmarks/sglang_gpu_workload.py report RESULT.json...

The workflow is the paper's synthetic sequential one: 10 agents, each with a fixed prompt of 4,096
tokens, a dynamic part of 32 and an output of 32 tokens; every agent is warmed once, then 3 rounds
are timed end to end. With ``--hints`` every call carries the kvflow hint (steps of all agents:
agent j is ``(j - i) mod 10`` steps away while agent i runs) and the fixed-prefix boundary, and the
run fails unless kvflow's counters show it applied the hints and tagged the prefixes; without
``--hints`` it fails if the kvflow plugin answers (a stock run must be stock). Each run (``--run``)
draws its own prompts, so a second run on the same server starts from the same cold state.
"""

from __future__ import annotations

import argparse
import json
import os
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


# The smoke prompt: SmolLM2-135M answers "Paris" to this greedily (tested against the embedded
# engine); with "You are a helpful geography assistant." it answers in French about something else.
SMOKE_MESSAGES = [{"role": "system", "content": "You are a helpful assistant. Answer in one short sentence."},
                  {"role": "user", "content": "What is the capital of France?"}]
ENTRY_POINT = ("sglang.srt.plugins", "kvflow", "backends.sglang_kvflow:register")


def answers_paris(text: str) -> bool:
    return "paris" in text.lower()


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


def check_plugin() -> None:
    """SGLang finds plugins through installed package metadata only: the entry point must be
    registered in this Python (an import from the working directory is not enough)."""
    from importlib.metadata import entry_points

    group, name, value = ENTRY_POINT
    found = {ep.name: ep.value for ep in entry_points(group=group)}
    if found.get(name) != value:
        raise SystemExit(f"the kvflow plugin is not registered with SGLang: entry points {group} = {found}; "
                         f"run pip install -e '.[sglang]' in this repo with this Python")
    print(f"plugin: {group} {name} = {value}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a child that exited but was not reaped yet still answers kill(0)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def wait(url: str, seconds: float, pid: int | None = None) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if pid is not None and not _alive(pid):
            raise SystemExit(f"the server process {pid} exited before {url} became healthy")
        try:
            urllib.request.urlopen(f"{url}/health", timeout=5).read()
            return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            time.sleep(1)
    raise SystemExit(f"server at {url} not healthy after {seconds:.0f} s")


def smoke(url: str) -> None:
    """Real text from SmolLM2 through SGLang with the plugin, plus the kvflow routes."""
    hint = {"kvflow": {"workflow_id": "smoke", "agent": "geo", "steps": {"geo": 0}, "fixed_prefix": 1}}
    body = {"model": "default", "max_tokens": 24, "temperature": 0, "custom_params": hint,
            "messages": SMOKE_MESSAGES}
    text = _post(f"{url}/v1/chat/completions", body)["choices"][0]["message"]["content"]
    print(f"smoke: {text!r}")
    if not answers_paris(text):
        raise SystemExit(f"smoke: SmolLM2 did not answer Paris: {text!r}")
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
    counters = _get(f"{url}/kvflow/v1/stats").get("counters", {})
    print("smoke: stats", json.dumps(counters))
    if counters.get("hinted_requests", 0) < 1:
        raise SystemExit(f"smoke: kvflow did not act: the hinted request is not counted ({counters})")


def _plugin_answers(url: str) -> bool:
    try:
        _get(f"{url}/kvflow/v1/info")
        return True
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return False
        raise


def check_acted(label: str, counters: dict, calls: int) -> None:
    """Fail unless kvflow's counters show the plugin applied every hint and tagged prefixes."""
    hinted, tagged = counters.get("hinted_requests", 0), counters.get("tagged_requests", 0)
    if hinted < calls or tagged == 0:
        raise SystemExit(f"{label}: kvflow did not act: {hinted} of {calls} hinted requests applied, "
                         f"{tagged} prefixes tagged ({counters})")


def workflow(url: str, label: str, out: str, hints: bool, run: int = 1) -> None:
    if _plugin_answers(url) != hints:
        raise SystemExit(f"{label}: the kvflow plugin {'does not answer' if hints else 'answers'} at "
                         f"{url}/kvflow/v1/info; this run would not measure what its label says")
    rng = random.Random(run)  # each run its own prompts: nothing cached from the previous run helps
    workflow_id = f"bench-{run}"
    before = _get(f"{url}/kvflow/v1/stats").get("counters", {}) if hints else {}
    fixed = [[rng.randrange(1000, 40000) for _ in range(FIXED)] for _ in range(AGENTS)]

    def call(i: int, round_: int) -> None:
        ids = fixed[i] + [rng.randrange(1000, 40000) for _ in range(DYNAMIC)]
        sampling = {"max_new_tokens": OUTPUT, "temperature": 0, "ignore_eos": True}
        if hints:
            steps = {f"agent{j}": (j - i) % AGENTS for j in range(AGENTS)}
            sampling["custom_params"] = {
                "kvflow": {"workflow_id": workflow_id, "agent": f"agent{i}", "steps": steps},
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
        _post(f"{url}/kvflow/v1/steps", {"workflow_id": workflow_id, "done": True})
        after = _get(f"{url}/kvflow/v1/stats").get("counters", {})
        stats = {k: v - before.get(k, 0) for k, v in after.items()}
        check_acted(label, stats, (ROUNDS + 1) * AGENTS)
    Path(out).write_text(json.dumps({"label": label, "run": run, "seconds": seconds, "calls": ROUNDS * AGENTS,
                                     "kvflow": stats}))
    print(f"{label} run {run}: {seconds:.2f} s for {ROUNDS * AGENTS} calls {stats or ''}")


def report(paths: list[str]) -> None:
    """Every run's time side by side, and the ratios of each run."""
    runs: dict[str, dict[int, float]] = {}
    for r in (json.loads(Path(p).read_text()) for p in paths):
        runs.setdefault(r["label"], {})[r.get("run", 1)] = r["seconds"]
    numbers = sorted({n for per in runs.values() for n in per})
    print("\nend-to-end time, synthetic workflow (10 agents, fixed 4096, dynamic 32, output 32, 3 rounds):")
    print("  " + " " * 14 + "".join(f"{'run ' + str(n):>10}" for n in numbers))
    for label, per in runs.items():
        print(f"  {label:<14}" + "".join(f"{per[n]:9.2f}s" if n in per else f"{'-':>10}" for n in numbers))
    pairs = [("kvflow", "stock-lru"), ("kvflow", "stock-hicache"), ("stock-hicache", "stock-lru")]
    for fast, base in pairs:
        if fast in runs and base in runs:
            ratios = [f"{runs[base][n] / runs[fast][n]:.2f}x" for n in numbers if n in runs[base] and n in runs[fast]]
            print(f"  speedup {fast} vs {base}: {' '.join(ratios)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("check-plugin")
    p = sub.add_parser("llama8b-config")
    p.add_argument("smollm2_dir")
    p.add_argument("out_dir")
    p = sub.add_parser("wait")
    p.add_argument("url")
    p.add_argument("seconds", type=float)
    p.add_argument("--pid", type=int, help="the server process: stop waiting when it exits")
    p = sub.add_parser("smoke")
    p.add_argument("url")
    p = sub.add_parser("workflow")
    p.add_argument("url")
    p.add_argument("--label", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--hints", action="store_true")
    p.add_argument("--run", type=int, default=1)
    p = sub.add_parser("report")
    p.add_argument("results", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "check-plugin":
        check_plugin()
    elif args.cmd == "llama8b-config":
        llama8b_config(args.smollm2_dir, args.out_dir)
    elif args.cmd == "wait":
        wait(args.url, args.seconds, args.pid)
    elif args.cmd == "smoke":
        smoke(args.url)
    elif args.cmd == "workflow":
        workflow(args.url, args.label, args.out, args.hints, args.run)
    else:
        report(args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
