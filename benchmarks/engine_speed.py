"""Raw speed of the embedded engine: decode tokens/s at batch 1 and 8, time to first token on fresh
1k- and 4k-token prompts; with ``--vs-vllm URL`` the same requests against a running vLLM server
(its OpenAI ``/v1/completions`` route, prompts sent as token ids), side by side.

Every figure is the median of ``--repeats`` runs (the load average is printed before and after: on a
shared machine, compare figures from the same run only). Decode tokens/s counts the tokens after
each request's first, over the time from the last request's first token to the last token (batch
B: B requests of ``--context`` prompt tokens submitted together, each ``--decode-tokens`` long,
``ignore_eos``). Time to first
token: one request of N prompt tokens (new content each time, no cache hit) generating one token.

    python benchmarks/engine_speed.py [--model smollm2-135m] [--dtype float32|bfloat16] [--device cpu]
        [--batches 1 8] [--ttft 1000 4000] [--context 32] [--decode-tokens 64] [--repeats 3]
        [--vs-vllm http://127.0.0.1:8000 [--vllm-model NAME]] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _engine_workload import describe_machine, random_tokens

from backends.base import GenerateRequest, SamplingParams
from backends.local import Engine, EngineConfig

# A streamed call: prompt ids, max tokens -> (time of each token since submission)
Caller = Callable[[Sequence[int], int], Awaitable[list[float]]]


def engine_caller(engine: Engine) -> Caller:
    async def call(prompt: Sequence[int], max_tokens: int) -> list[float]:
        start, stamps = time.perf_counter(), []
        sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        request = GenerateRequest(tuple(prompt), sampling)
        async for event in engine.stream(request):
            if event.token_id is not None:
                stamps.append(time.perf_counter() - start)
        return stamps

    return call


def vllm_caller(url: str, model: str) -> Caller:
    import httpx

    client = httpx.AsyncClient(base_url=url, timeout=600)

    async def call(prompt: Sequence[int], max_tokens: int) -> list[float]:
        body = {"model": model, "prompt": list(prompt), "max_tokens": max_tokens, "temperature": 0.0,
                "ignore_eos": True, "stream": True}
        start, stamps = time.perf_counter(), []
        async with client.stream("POST", "/v1/completions", json=body) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    if json.loads(line[6:])["choices"][0].get("text") is not None:
                        stamps.append(time.perf_counter() - start)
        return stamps

    return call


async def decode_rate(call: Caller, prompts: Sequence[Sequence[int]], tokens: int) -> float:
    runs = await asyncio.gather(*(call(p, tokens) for p in prompts))
    after_first = sum(len(s) - 1 for s in runs)
    span = max(s[-1] for s in runs) - max(s[0] for s in runs)
    return after_first / span


async def ttft(call: Caller, prompt: Sequence[int]) -> float:
    return (await call(prompt, 1))[0]


def measure(call: Caller, make_prompt: Callable[[int, int], Sequence[int]],
            args: argparse.Namespace) -> dict[str, float]:
    async def run() -> dict[str, float]:
        out: dict[str, float] = {}
        await decode_rate(call, [make_prompt(32, 999)], 4)  # warm-up
        seed = 0
        for b in args.batches:
            rates = []
            for _ in range(args.repeats):
                seed += 1
                prompts = [make_prompt(args.context, seed * 100 + i) for i in range(b)]
                rates.append(await decode_rate(call, prompts, args.decode_tokens))
            out[f"decode_tok_s_b{b}"] = statistics.median(rates)
        for n in args.ttft:
            times = []
            for _ in range(args.repeats):
                seed += 1
                times.append(await ttft(call, make_prompt(n, seed * 100)))
            out[f"ttft_s_{n}"] = statistics.median(times)
        return out

    return asyncio.run(run())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--ttft", type=int, nargs="*", default=[1000, 4000], help="prompt lengths (none: skip)")
    parser.add_argument("--context", type=int, default=32, help="prompt tokens of each decoding request")
    parser.add_argument("--decode-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vs-vllm", metavar="URL", help="a running vLLM server serving the same model")
    parser.add_argument("--vllm-model", help="the model name vLLM serves (default: its first /v1/models entry)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    if args.decode_tokens < 2 or args.repeats < 1 or min(args.batches) < 1 or min(args.ttft, default=1) < 1 \
            or args.context < 1:
        parser.error("--decode-tokens must be >= 2; --repeats, --batches, --ttft and --context >= 1")
    print(describe_machine(), flush=True)
    longest = max(args.ttft + [args.context + args.decode_tokens])
    engine = Engine(EngineConfig.build(model=args.model, dtype=args.dtype, device=args.device,
                                       max_batch=max(8, *args.batches),
                                       device_tokens=max(8192, 2 * longest + 64 * max(args.batches)), host_tokens=0))
    info = engine.info()
    print(f"engine: {info['model']} {info['dtype']} on {info['tiers']['device']['device']}, "
          f"chunk {info['chunk_tokens']} tokens", flush=True)

    def make_prompt(n: int, seed: int) -> tuple[int, ...]:
        return random_tokens(engine, n, seed=seed)

    results: dict[str, Any] = {"engine": {"model": info["model"], "dtype": info["dtype"]}}
    try:
        results["engine"].update(measure(engine_caller(engine), make_prompt, args))
    finally:
        engine.close()
    if args.vs_vllm:
        name = args.vllm_model
        if name is None:
            import httpx

            name = httpx.get(args.vs_vllm.rstrip("/") + "/v1/models", timeout=30).json()["data"][0]["id"]
        results["vllm"] = {"model": name, **measure(vllm_caller(args.vs_vllm.rstrip("/"), name), make_prompt, args)}
    keys = [k for k in results["engine"] if k not in ("model", "dtype")]
    print(f"\n{'figure':18s} {'engine':>10s}" + (f" {'vLLM':>10s} {'engine/vLLM':>12s}" if "vllm" in results else ""))
    for key in keys:
        line = f"{key:18s} {results['engine'][key]:10.3f}"
        if "vllm" in results:
            line += f" {results['vllm'][key]:10.3f} {results['engine'][key] / results['vllm'][key]:11.2f}x"
        print(line)
    if "vllm" not in results:
        print("vs vLLM: not run (no --vs-vllm URL)")
    print(describe_machine())
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
