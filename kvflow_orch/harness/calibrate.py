"""Measure the embedded engine on this machine as a hardware profile, and check the simulator against
the real engine on the synthetic workflow (``kvflow bench calibrate [--compare]``, the GPU check).

Times are process CPU seconds with torch on one thread (see ``_CpuClock``): on a shared machine
wall-clock figures swing with other jobs' load, CPU seconds do not. The comparison runs the calls
one after another, so the engine's time is the sum of its calls' CPU time.

Measured: prefill time against prompt length (slope -> effective FLOP/s, intercept -> per-iteration
overhead), one decode step at batch 1 (-> effective memory bandwidth over the weights and KV), and a
host->device slot copy of the engine's own KV layout (-> link bandwidth and latency). The profile
stores these as peak rates with efficiency 1, so the roofline reproduces the measurements.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any, Sequence

from backends.sim.profiles import HardwareProfile, ModelProfile

__all__ = ["model_profile_of", "fit_line", "measure", "compare", "COMPARE_TOLERANCE"]


COMPARE_TOLERANCE = 0.20
"""The simulator's end-to-end time is to come within this share of the real engine's."""


def model_profile_of(name: str, cfg: Any, dtype_bytes: int) -> ModelProfile:
    """A roofline profile of an embedded-engine model config: the parameters every token multiplies
    (attention, MLP and the LM head; the embedding lookup is no matmul)."""
    h, hd = cfg.hidden_size, cfg.head_dim
    attn = h * cfg.num_heads * hd * 2 + h * cfg.num_kv_heads * hd * 2
    mlp = 3 * h * cfg.intermediate_size
    params = cfg.num_layers * (attn + mlp) + cfg.vocab_size * h
    return ModelProfile(name, params=float(params), n_layers=cfg.num_layers, hidden_size=h, n_heads=cfg.num_heads,
                        n_kv_heads=cfg.num_kv_heads, head_dim=hd, dtype_bytes=dtype_bytes,
                        description="measured by kvflow bench calibrate")


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares ``y = a + b x``; returns ``(a, b)``."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - b * mx, b


def _engine(model: str, device_tokens: int, host_tokens: int, prefetch: bool = True):
    from backends.local import Engine, EngineConfig

    return Engine(EngineConfig.build(model=model, device_tokens=device_tokens, host_tokens=host_tokens,
                               policy="kvflow", prefetch=prefetch, write_through=True))


async def _generate(engine, ids: Sequence[int], max_tokens: int, hint=None, fixed: int | None = None):
    from backends.base import GenerateRequest, SamplingParams

    vocab = engine.model_config.vocab_size
    req = GenerateRequest(tuple(t % vocab for t in ids), SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                          hint=hint, fixed_prefix_tokens=fixed)
    return await engine.generate(req)


class _CpuClock:
    """Process CPU time with torch on one thread: on a machine shared with other jobs, CPU seconds
    stay what the engine's work costs, where wall-clock seconds stretch with everyone else's load.
    Used for both the calibration and the comparison, so the two are measured alike."""

    def __enter__(self) -> "_CpuClock":
        import torch

        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch

        torch.set_num_threads(self._threads)

    @staticmethod
    def now() -> float:
        return time.process_time()


async def _cpu_of(engine, ids: Sequence[int], max_tokens: int, hint=None, fixed: int | None = None) -> float:
    t = _CpuClock.now()
    await _generate(engine, ids, max_tokens, hint, fixed)
    return _CpuClock.now() - t


def measure(model: str = "tiny-random", repeats: int = 3,
            context: int = 256) -> tuple[HardwareProfile, ModelProfile, dict[str, Any]]:
    """Measure the engine; returns the fitted hardware profile, the model profile and raw figures
    (CPU seconds, see :class:`_CpuClock`). The decode step is timed at ``context`` tokens (the
    workloads' typical context); every figure is the best of ``repeats`` runs."""
    import torch

    from backends.local.pools import KVPool, copy_slots

    engine = _engine(model, device_tokens=8192, host_tokens=8192, prefetch=False)
    cfg = engine.model_config
    dtype = engine.config.torch_dtype()
    mprof = model_profile_of(engine.model_name, cfg, torch.empty((), dtype=dtype).element_size())
    rng = random.Random(0)
    steps = 33

    def ids(n: int) -> list[int]:
        return [rng.randrange(10**6) for _ in range(n)]

    async def run() -> tuple[list[tuple[int, float]], float]:
        await engine.start()
        try:
            await _generate(engine, ids(64), 2)  # warm the kernels
            points = []
            for n in (64, 256, 512, 1024):
                points.append((n, min([await _cpu_of(engine, ids(n), 1) for _ in range(repeats)])))
            one = min([await _cpu_of(engine, ids(context), 1) for _ in range(repeats)])
            many = min([await _cpu_of(engine, ids(context), steps) for _ in range(repeats)])
            return points, (many - one) / (steps - 1)
        finally:
            await engine.shutdown()

    with _CpuClock():
        points, decode_s = asyncio.run(run())
        src = KVPool(cfg, 4096, device="cpu", dtype=dtype)
        dst = KVPool(cfg, 4096, device="cpu", dtype=dtype)
        copies = []
        for n in (256, 4096):
            slots = list(range(n))
            best = float("inf")
            for _ in range(repeats):
                t = _CpuClock.now()
                copy_slots(src, slots, dst, slots)
                best = min(best, _CpuClock.now() - t)
            copies.append((n, best))
    intercept, per_token = fit_line([p[0] for p in points], [p[1] for p in points])
    # The intercept is the per-iteration overhead; a noisy fit must not claim most of a decode step.
    overhead = min(max(0.0, intercept), decode_s / 2)
    flops = 2 * mprof.params / per_token
    decode_bytes = mprof.weight_bytes + (context + steps // 2) * mprof.kv_bytes_per_token  # mid-run context
    mem_bw = decode_bytes / (decode_s - overhead)
    link_latency, link_per_token = fit_line([c[0] for c in copies], [c[1] for c in copies])
    link_bw = mprof.kv_bytes_per_token / link_per_token
    hw = HardwareProfile(
        name=f"calibrated-{engine.model_name}", peak_flops=flops, mem_bandwidth=mem_bw, memory_bytes=1e12,
        link_bandwidth=link_bw, mem_fraction=1.0, link_efficiency=1.0, link_latency_s=max(0.0, link_latency),
        compute_efficiency=1.0, memory_efficiency=1.0, step_overhead_s=overhead,
        description="this machine (CPU seconds, one torch thread), measured through the embedded engine "
                    "by kvflow bench calibrate",
    )
    raw = {"prefill_points": points, "decode_step_s": decode_s, "copy_points": copies}
    return hw, mprof, raw


def compare(model: str, hw: HardwareProfile, mprof: ModelProfile, *, agents: int, fixed: int, rounds: int,
            output: int = 16, dynamic: int = 16) -> dict[str, Any]:
    """Run the synthetic sequential workflow on the real engine and on the simulator (system kvflow,
    same pools); returns both end-to-end times and the relative error."""
    from backends.sim.simulate import simulate
    from backends.sim.systems import SYSTEMS

    from .scenarios import synthetic

    device = agents * fixed // 2 + 2 * (fixed + dynamic + output)
    host = 4 * agents * (fixed + dynamic + output)
    workload = synthetic(fixed=fixed, dynamic=dynamic, output=output, n_agents=agents, rounds=rounds)
    submitted: list[Any] = []  # the exact request sequence the simulated orchestrator sends
    sim = simulate(SYSTEMS["kvflow"], workload, hw, mprof, device_tokens=device, host_tokens=host,
                   on_submit=submitted.append)
    warm = len(workload.instances[0].spec.fixed)
    engine = _engine(model, device_tokens=device, host_tokens=host)

    async def run() -> float:
        await engine.start()
        try:
            for r in submitted[:warm]:
                await _generate(engine, r.prompt, len(r.output), r.hint, r.fixed_tokens)
            return sum([await _cpu_of(engine, r.prompt, len(r.output), r.hint, r.fixed_tokens)
                        for r in submitted[warm:]])
        finally:
            await engine.shutdown()

    with _CpuClock():
        real = asyncio.run(run())
    return {"real_s": real, "simulated_s": sim.latency_s, "error": sim.latency_s / real - 1.0,
            "calls": len(submitted) - warm, "device_tokens": device, "host_tokens": host,
            "agents": agents, "fixed": fixed, "rounds": rounds, "output": output, "dynamic": dynamic}
