"""Real agent-framework traffic replayed on the embedded engine (issue 23's "Measure"): LRU, learned
hints, declared hints and the floor with Bélády beside it, and the learner's accuracy against the
frameworks' own agent names, side by side in one run.

    flock /tmp/kvflow-timing.lock env PYTHONPATH=$PWD .venv/bin/python benchmarks/framework_traffic.py \\
        [--recordings benchmarks/results/framework-traffic] [--apps a,b] [--model smollm2-135m] \\
        [--pool-prompts 1.5] [--out DIR]

Input: the recordings ``benchmarks/record_framework_traffic.py`` wrote (each request's exact body in
arrival order, the truth its app named, the reply it got). Per app:

* **Accuracy** (the learner alone, fed what ``kvflow serve --learned-hints`` is fed: each body with
  any declared hint removed, then the reply the app got): *attribution*, the share of requests whose
  learned agent is the one matched to their framework agent (a one-to-one matching, most shared
  requests first: splitting one framework agent in two, or merging two, counts against it), and
  *session linking* on the requests with no session key, the same way with sessions.
* **Replays**, each on a fresh engine (``kvflow serve``'s app in this process, policy kvflow, no host
  tier), the requests one at a time in recorded order: *floor* (a pool that never evicts, checked; the
  tokens any policy must compute), then with a device pool of ``--pool-prompts`` times the
  longest prompt (below the working set of the interleaved sessions): *LRU* (hints removed, no
  learner: the brain sees no hint), *learned* (hints removed, the learner on), *declared* (the
  instrumented LangGraph app only: bodies as recorded, with its steps updates), and *Bélády*:
  the LRU run's brain calls replayed with the offline-optimal order (``backends/kvcache/trace.py``).
  Tool-call ids are minted at random by the server: where a later request echoes a recorded id,
  the replay sends the id its own server minted for that call, as the app would have.

Targets, printed per app: attribution >= 99%, linking >= 95%; where LRU recomputes > 1.1x the
floor, learned <= LRU - 0.5 (LRU - floor); on the LangGraph app learned within 5% of declared;
greedy outputs identical in every replay (caching never changes them). Writes ``results.json``
under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "benchmarks"), str(ROOT / "tests" / "frameworks")]

from _traffic_recording import read_records  # noqa: E402
from framework_runs import app_on_loopback  # noqa: E402

from backends.learn import Learned, TrafficLearner  # noqa: E402
from backends.learn.host import reply_of_response  # noqa: E402
from backends.learn.requests import read_chat  # noqa: E402

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
STEPS = "/kvflow/v1/steps"
HINT_FIELDS = ("custom_params", "kv_transfer_params")
DECLARED_APPS = ("instrumented_langgraph",)


# ---- what a replay sends ----------------------------------------------------------------
def plain(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without kvflow's hint (``custom_params.kvflow``, ``kv_transfer_params.kvflow``)."""
    out = dict(body)
    for field in HINT_FIELDS:
        if isinstance(out.get(field), dict):
            rest = {k: v for k, v in out[field].items() if k != "kvflow"}
            if rest:
                out[field] = rest
            else:
                del out[field]
    return out


def stream(records: list[dict[str, Any]], declared: bool) -> list[dict[str, Any]]:
    """The records a replay sends: answered generation requests (plain unless ``declared``), and
    with ``declared`` the steps updates."""
    out = []
    for r in records:
        if r["status"] != 200 or not isinstance(r["body"], dict):
            continue
        if r["path"] in ROUTES:
            out.append({**r, "body": r["body"] if declared else plain(r["body"])})
        elif r["path"] == STEPS and declared:
            out.append(r)
    return out


def call_ids(message: dict[str, Any] | None) -> list[str]:
    return [str(c.get("id", "")) for c in (message or {}).get("tool_calls") or [] if isinstance(c, dict)]


def comparable(message: dict[str, Any] | None) -> Any:
    """A reply without what the server mints at random (tool-call ids)."""
    if message is None:
        return None
    calls = [((c.get("function") or {}).get("name"), (c.get("function") or {}).get("arguments"))
             for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    return [message.get("content"), calls]


# ---- accuracy -----------------------------------------------------------------------------
def matched_share(pairs: list[tuple[str, str]]) -> float:
    """Share of ``(truth, learned)`` pairs right under a one-to-one matching of truth to learned
    labels, the pairs shared most first."""
    if not pairs:
        return 1.0
    counts = Counter(pairs)
    truth_used, learned_used, right = set(), set(), 0
    for (t, lab), n in sorted(counts.items(), key=lambda kv: -kv[1]):
        if t not in truth_used and lab not in learned_used:
            truth_used.add(t)
            learned_used.add(lab)
            right += n
    return right / len(pairs)


def accuracy(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The learner fed the recorded stream (hints removed) and the replies the app got."""
    learner = TrafficLearner()
    agents, sessions, per_agent = [], [], Counter()
    for r in stream(records, declared=False):
        route = ROUTES[r["path"]]
        learned = learner.observe(r["body"], route=route, headers=r["headers"])
        if r["reply"] is not None:
            learner.reply(learned, r["reply"])
        truth = r["truth"]
        agents.append((truth["agent"], learned.agent))
        per_agent[(truth["agent"], learned.agent)] += 1
        if route != "chat" or read_chat(r["body"], r["headers"]).session_key is None:
            sessions.append((truth["session"], learned.session_id))
    return {"requests": len(agents), "truth_agents": len({t for t, _ in agents}),
            "learned_agents": len({a for _, a in agents}), "attribution": matched_share(agents),
            "keyless_requests": len(sessions), "truth_sessions": len({t for t, _ in sessions}),
            "learned_sessions": len({s for _, s in sessions}), "linking": matched_share(sessions),
            "agents": {f"{t} -> {a}": n for (t, a), n in sorted(per_agent.items())}}


# ---- replays ------------------------------------------------------------------------------
class TappedLearner(TrafficLearner):
    """The server's learner, keeping what it answered each request (for the replay's own accuracy)."""

    def __init__(self) -> None:
        super().__init__()
        self.answers: list[Learned] = []

    def observe(self, body, **kw) -> Learned:  # type: ignore[override]
        learned = super().observe(body, **kw)
        self.answers.append(learned)
        return learned


@contextmanager
def engine_server(model: str, pool: int, learner: TrafficLearner | None) -> Iterator[tuple[str, Any, Any]]:
    """``kvflow serve``'s app (policy kvflow, no host tier) in this process with its brain's calls
    recorded; yields its URL, the recorder and the cache config."""
    from backends.kvcache.trace import BrainRecorder
    from backends.local import Engine, EngineConfig
    from backends.server import create_app

    engine = Engine(EngineConfig.build(model=model, policy="kvflow", device_tokens=pool, host_tokens=0))
    recorder = BrainRecorder(engine.scheduler.cache)
    with app_on_loopback(create_app(engine, learner=learner)) as url:
        yield url, recorder, engine.config.cache


def replay_run(records: list[dict[str, Any]], model: str, pool: int, mode: str) -> dict[str, Any]:
    """One replay (module docstring); ``mode`` in floor, lru, learned, declared."""
    learner = TappedLearner() if mode == "learned" else None
    sent = stream(records, declared=mode == "declared")
    renamed: dict[str, str] = {}  # recorded tool-call id -> the id this replay's server minted
    replies, same_as_recorded, prompts = [], 0, []
    with engine_server(model, pool, learner) as (url, recorder, config), httpx.Client(timeout=900) as client:
        start = time.perf_counter()
        for r in sent:
            text = json.dumps(r["body"])
            for old, new in renamed.items():
                text = text.replace(old, new)
            answer = client.post(url + r["path"], content=text, headers={"content-type": "application/json",
                                                                         **r["headers"]})
            if r["path"] == STEPS:
                continue
            if answer.status_code != 200:
                raise SystemExit(f"replay ({mode}): {r['path']} answered {answer.status_code}: {answer.text[:300]}")
            route = ROUTES[r["path"]]
            reply = reply_of_response(route, answer.content, bool(r["body"].get("stream")))
            minted = zip(call_ids(r["reply"]), call_ids(reply), strict=False)  # as many when the replies match
            renamed.update({old: new for old, new in minted if old and new})
            replies.append(comparable(reply))
            same_as_recorded += comparable(reply) == comparable(r["reply"])
            if not r["body"].get("stream"):
                prompts.append(answer.json()["usage"]["prompt_tokens"])
        seconds = time.perf_counter() - start
        stats = client.get(url + "/kvflow/v1/stats").json()
    out = {"pool": pool, "requests": len(replies), "recomputed": stats["recomputed_tokens"],
           "evicted": stats.get("evicted_device_tokens", 0),
           "seconds": round(seconds, 1), "replies_as_recorded": same_as_recorded, "_replies": replies,
           "_events": recorder.events, "_config": config, "max_prompt": max(prompts, default=0),
           "prompt_tokens": sum(prompts)}
    if learner is not None:
        truth = [r["truth"] for r in sent if r["path"] in ROUTES]
        answers = learner.answers
        if len(answers) != len(truth):
            raise SystemExit(f"replay (learned): the learner saw {len(answers)} of {len(truth)} requests")
        out["attribution"] = matched_share([(t["agent"], a.agent) for t, a in zip(truth, answers, strict=True)])
        out["linking"] = matched_share([(t["session"], a.session_id) for t, a in zip(truth, answers, strict=True)])
        out["sources"] = dict(Counter(a.source for a in answers))
    return out


def progress(app: str, mode: str, run: dict[str, Any]) -> None:
    """One line per finished replay: a slow one (a loaded machine) shows where it stands."""
    print(f"  {app} {mode}: pool {run['pool']}, {run['requests']} requests in {run['seconds']} s, "
          f"recomputed {run['recomputed']}", flush=True)


def belady(run: dict[str, Any]) -> int:
    from backends.kvcache.trace import replay

    return replay(run["_events"], run["_config"], belady=True).stats.recomputed_tokens


# ---- the run ------------------------------------------------------------------------------
def app_part(app: str, records: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    acc = accuracy(records)
    runs = {"floor": replay_run(records, args.model, args.floor_pool, "floor")}
    progress(app, "floor", runs["floor"])
    if runs["floor"]["evicted"]:
        raise SystemExit(f"{app}: the floor's pool of {args.floor_pool} tokens evicted: give a larger --floor-pool")
    pool = max(args.min_pool, int(args.pool_prompts * runs["floor"]["max_prompt"]))
    modes = ["lru", "learned"] + (["declared"] if app in DECLARED_APPS else [])
    for mode in modes:
        runs[mode] = replay_run(records, args.model, pool, mode)
        progress(app, mode, runs[mode])
    runs["belady"] = {"recomputed": belady(runs["lru"])}
    # Belady on the learned run's own trace: tags split nodes where LRU's did not, and a node is what
    # eviction takes whole, so learned can go below Belady on LRU's trace (not below this one)
    from backends.kvcache.trace import TraceError

    try:
        runs["belady_learned"] = {"recomputed": belady(runs["learned"])}
    except TraceError as exc:
        runs["belady_learned"] = {"recomputed": None, "error": str(exc)}
    first = runs["lru"]["_replies"]
    same = all(r["_replies"] == first for name, r in runs.items() if "_replies" in r)
    return {"accuracy": acc, "pool": pool, "same_outputs": same,
            "runs": {n: {k: v for k, v in r.items() if not k.startswith("_")} for n, r in runs.items()}}


def verdicts(app: str, part: dict[str, Any]) -> list[tuple[bool | None, str]]:
    acc, runs = part["accuracy"], part["runs"]
    out: list[tuple[bool | None, str]] = [
        (acc["attribution"] >= 0.99, f"{app}: attribution {acc['attribution']:.1%} (target >= 99%)"),
        (acc["linking"] >= 0.95, f"{app}: session linking {acc['linking']:.1%} of {acc['keyless_requests']} "
                                 f"requests with no session key (target >= 95%)")]
    lru, floor, learned = runs["lru"]["recomputed"], runs["floor"]["recomputed"], runs["learned"]["recomputed"]
    bound = lru - 0.5 * (lru - floor)
    best = runs["belady"]["recomputed"]
    if lru > 1.1 * floor:
        reach = "" if best <= bound else "; Belady itself is above it: no eviction order reaches it at this pool"
        out.append((learned <= bound, f"{app}: learned recomputes {learned} <= LRU - 0.5 (LRU - floor) = {bound:.0f} "
                                      f"(LRU {lru}, floor {floor}, Belady {best}{reach})"))
    else:
        out.append((None, f"{app}: LRU {lru} is within 10% of the floor {floor}: no recomputation target"))
    if "declared" in runs:
        declared = runs["declared"]["recomputed"]
        out.append((learned <= 1.05 * declared, f"{app}: learned {learned} within 5% of declared {declared}"))
    out.append((part["same_outputs"], f"{app}: greedy outputs identical in every replay"))
    return out


def report(results: dict[str, Any], pool_prompts: float) -> bool:
    """Print the table and the verdicts; True when a target failed."""
    models = sorted({part["meta"]["model"] for part in results.values()})
    print(f"\nmodel {', '.join(models)}; device pool {pool_prompts}x each app's longest prompt, no host tier; "
          "requests one at a time in recorded order\n")
    print(f"{'app':<24}{'reqs':>5}{'agents':>7}{'attrib':>8}{'link':>7}{'pool':>6}{'floor':>7}{'LRU':>7}"
          f"{'learned':>8}{'declared':>9}{'Belady':>7}{'target':>8}{'same':>6}")
    for app, part in results.items():
        acc, runs = part["accuracy"], part["runs"]
        lru, floor = runs["lru"]["recomputed"], runs["floor"]["recomputed"]
        declared = runs.get("declared", {}).get("recomputed", "-")
        print(f"{app:<24}{acc['requests']:>5}{acc['truth_agents']:>4}/{acc['learned_agents']:<2}"
              f"{acc['attribution']:>8.1%}{acc['linking']:>7.1%}{part['pool']:>6}{floor:>7}{lru:>7}"
              f"{runs['learned']['recomputed']:>8}{declared:>9}{runs['belady']['recomputed']:>7}"
              f"{lru - 0.5 * (lru - floor):>8.0f}{str(part['same_outputs']):>6}")
    print("\n(recomputed prompt tokens; agents: framework / learned; target: LRU - 0.5 (LRU - floor); same: greedy "
          "outputs identical in every replay)\n")
    for app, part in results.items():
        learned = part["runs"]["learned"]
        print(f"{app}: learned replay's own attribution {learned['attribution']:.1%}, linking "
              f"{learned['linking']:.1%}, hints {learned['sources']}; replies as recorded "
              f"{learned['replies_as_recorded']}/{learned['requests']}; agents {part['accuracy']['agents']}"
              + (f"; Belady on the learned run's own trace {part['runs']['belady_learned']['recomputed']}"
                 if "belady_learned" in part["runs"] else ""))
    print()
    failed = False
    for app, part in results.items():
        for ok, text in verdicts(app, part):
            failed |= ok is False
            print(f"  {'PASS' if ok else 'FAIL' if ok is False else 'n/a '}  {text}")
    return failed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recordings", type=Path, default=ROOT / "benchmarks" / "results" / "framework-traffic")
    p.add_argument("--apps", default=None, help="comma-separated (default: every recording)")
    p.add_argument("--model", default=None, help="default: the recordings' model")
    p.add_argument("--pool-prompts", type=float, default=1.5, help="device pool in longest prompts (default 1.5)")
    p.add_argument("--min-pool", type=int, default=512)
    p.add_argument("--floor-pool", type=int, default=32768,
                   help="the floor's pool (default 32768 tokens): the run fails if it evicts")
    p.add_argument("--out", type=Path, default=None, help="default: --recordings")
    p.add_argument("--report", type=Path, nargs="+", default=None, metavar="RESULTS",
                   help="only print the table and verdicts of earlier runs' results.json files, together")
    args = p.parse_args()
    if args.report:
        merged: dict[str, Any] = {}
        for path in args.report:
            merged.update(json.loads(path.read_text()))
        return 1 if report(merged, args.pool_prompts) else 0
    out = args.out or args.recordings
    files = sorted(args.recordings.glob("*.jsonl"))
    if args.apps:
        wanted = args.apps.split(",")
        files = [f for f in files if f.stem in wanted]
        missing = set(wanted) - {f.stem for f in files}
        if missing:
            p.error(f"no recording for {sorted(missing)} in {args.recordings}")
    if not files:
        p.error(f"no recordings (*.jsonl) in {args.recordings}: run benchmarks/record_framework_traffic.py")
    load = lambda: subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()  # noqa: E731
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S')}  uptime: {load()}")
    results = {}
    for f in files:
        meta, records = read_records(f)
        args.model = args.model or meta["model"]
        results[f.stem] = {"meta": meta, **app_part(f.stem, records, args)}
        print(f"  replayed {f.stem}", flush=True)
    failed = report(results, args.pool_prompts)
    print(f"\nuptime after: {load()}")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
