"""``kvflow bench calibrate``: measure the embedded engine on this machine, write a hardware profile,
and (``--compare``) check the simulator against the real engine on the synthetic workflow. The
measuring is :mod:`kvflow_orch.harness.calibrate`; this module prints and writes the files."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..harness.calibrate import COMPARE_TOLERANCE, compare, measure

__all__ = ["main"]


def main(args: argparse.Namespace) -> int:
    print(f"kvflow bench calibrate: measuring {args.model} on this machine (prefill, decode, copy)...",
          file=sys.stderr, flush=True)
    hw, mprof, raw = measure(args.model)
    out = args.out or Path("kvflow-results") / f"calibrated-{mprof.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(hw.to_json(), indent=1) + "\n")
    model_out = out.with_name(out.stem + ".model.json")
    model_out.write_text(json.dumps(mprof.to_json(), indent=1) + "\n")
    print(f"model {mprof.name}: {mprof.params / 1e6:.2f}M matmul params, {mprof.kv_bytes_per_token} KV bytes/token")
    print("prefill (tokens, s): " + ", ".join(f"({n}, {t:.4f})" for n, t in raw["prefill_points"]))
    print(f"decode step at batch 1: {raw['decode_step_s'] * 1e3:.2f} ms (CPU seconds, one torch thread)")
    print(f"fitted: {hw.peak_flops / 1e9:.1f} GFLOP/s, {hw.mem_bandwidth / 1e9:.1f} GB/s, "
          f"step overhead {hw.step_overhead_s * 1e3:.2f} ms, copy {hw.link_bandwidth / 1e9:.2f} GB/s "
          f"+ {hw.link_latency_s * 1e6:.0f} us")
    print(f"wrote {out} and {model_out} (use: kvflow bench sim --hardware {out} --model {model_out})")
    if args.compare:
        print("kvflow bench calibrate: running the synthetic workflow on the engine and the simulator...",
              file=sys.stderr, flush=True)
        result = compare(args.model, hw, mprof, agents=args.agents, fixed=args.fixed, rounds=args.rounds)
        ok = abs(result["error"]) <= COMPARE_TOLERANCE
        print(f"synthetic {result['agents']} agents x {result['rounds']} rounds, fixed {result['fixed']}: "
              f"real {result['real_s']:.2f}s, simulated {result['simulated_s']:.2f}s, "
              f"error {result['error']:+.1%} ({'PASS' if ok else 'FAIL'}: target within {COMPARE_TOLERANCE:.0%})")
        report = out.with_name(out.stem + ".compare.json")
        report.write_text(json.dumps(result, indent=1) + "\n")
    return 0
