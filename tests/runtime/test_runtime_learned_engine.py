"""Learned routing on the real embedded engine (tiny-random): the engine's counters show fewer
recomputed prompt tokens with expected steps than with static ones, and the outputs are the same."""

from __future__ import annotations

from backends.local import Engine, EngineConfig
from kvflow_orch import BranchStats, run
from workflows.supervisor import supervisor


def _run_all(wf, stats, device_tokens):
    engine = Engine(EngineConfig.build(model="tiny-random", device_tokens=device_tokens, host_tokens=0,
                                       policy="kvflow", prefetch=False))
    try:
        outputs = [run(wf, {"task": f"m{t}"}, backend=engine, branch_stats=stats).state for t in range(3)]
        return outputs, engine.stats()
    finally:
        engine.close()


def test_learned_steps_recompute_less_and_change_no_output():
    wf = supervisor(workers=6, rounds=6, fixed=48, dynamic=4, output=2)
    trained = BranchStats()
    trainer = Engine(EngineConfig.build(model="tiny-random"))
    try:
        for t in range(15):
            run(wf, {"task": f"train{t}"}, backend=trainer, branch_stats=trained)
    finally:
        trainer.close()
    asg = wf.compile()
    engine = Engine(EngineConfig.build(model="tiny-random"))
    prompt = max(len(engine.tokenizer.encode(asg.system_prompt(a))) for a in asg.agents) + 32
    engine.close()
    device = prompt * 3 + 128  # the supervisor and about two workers
    static_out, static = _run_all(wf, None, device)
    learned_out, learned = _run_all(wf, trained.copy(), device)
    assert learned_out == static_out

    def total(s):
        return s["device_hit_tokens"] + s["recomputed_tokens"]

    assert total(learned) == total(static)  # the same requests
    assert learned["recomputed_tokens"] < static["recomputed_tokens"], (learned, static)
