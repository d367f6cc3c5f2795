"""How much of a tool-using agent's repeat call the server finds cached before the call's new turns
(issue 24, point 1: "Tools cached", target >= 90%), for unmodified framework apps, old code beside new.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/tools_prefix.py --before-root /tmp/i24-base \\
        [--apps openai_agents_chat,openai_agents_responses,crewai] [--sessions 3] [--model tiny-random] [--out DIR]

For each code root (``--before-root``: a checkout of the base commit; ``--after-root``: this one) and
each app, the script starts ``kvflow serve`` from that root, puts a recording proxy in front of it,
runs the app (``tests/frameworks/apps``, in its framework venv) through the proxy, and reads what
the server itself answered: every reply's ``prompt_tokens`` and ``cached_tokens``. Repeat calls,
their new turns, ``before`` (the tokens before the new turns) and ``cached_before`` (those of them
found cached) are defined in ``tests/frameworks/cache_records.py`` (the frameworks test of the target
uses the same); the analysis runs under each root's own code, so the prompt is rendered as that root
rendered it.

It prints, per app, the sum of ``cached_before`` over the sum of ``before`` for repeat calls whose
new turns start with a user message (the target's case) and for all repeat calls, before and after,
and writes ``tools_prefix.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "frameworks"))
from cache_records import cached_share, recording_proxy, repeat_calls  # noqa: E402
from framework_runs import free_port, run_app, venv_python  # noqa: E402

APPS = {  # name -> (app script, venv, arguments)
    "openai_agents_chat": ("openai_agents_app", "frameworks", ("--api", "chat")),
    "openai_agents_responses": ("openai_agents_app", "frameworks", ("--api", "responses")),
    "crewai": ("crewai_app", "crewai", ("--process", "hierarchical")),
}


# ---- one run ----------------------------------------------------------------------------
def measure(root: Path, app: str, model: str, sessions: int, log: Path) -> dict[str, Any]:
    """Serve from ``root``, run ``app`` through the proxy, and summarise its repeat calls."""
    from backends.vllm_kvflow.launcher import running

    script, venv, args = APPS[app]
    python = venv_python(venv)
    if python is None:
        raise SystemExit(f"the {venv} venv is not built (bash .ci/setup-frameworks builds it)")
    port = free_port()
    argv = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--port", str(port), "--model", model,
            "--device-tokens", "65536", "--host-tokens", "0"]
    env = {**os.environ, "PYTHONPATH": str(root)}
    with running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=root, timeout_s=600) as url:
        with recording_proxy(url) as (proxy, records):
            run_app(python, script, proxy + "/v1", *args, "--sessions", str(sessions), timeout_s=3600)
    saved = log.with_suffix(".records.json")
    saved.write_text(json.dumps(records))
    analysed = subprocess.run([sys.executable, __file__, "--analyse", str(saved), "--model", model], env=env,
                              capture_output=True, text=True)
    if analysed.returncode != 0:
        raise SystemExit(f"analysing {saved} under {root} failed:\n{analysed.stderr[-4000:]}")
    calls = json.loads(analysed.stdout)
    return {"requests": len(records), "new_user_turn": cached_share([c for c in calls if c["new_user_turn"]]),
            "all_repeat": cached_share(calls), "calls": calls}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    parser.add_argument("--before-root", type=Path, help="a checkout of the base commit (required)")
    parser.add_argument("--after-root", type=Path, default=ROOT)
    parser.add_argument("--apps", default=",".join(APPS))
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--out", type=Path, default=None, help="write tools_prefix.json here")
    parser.add_argument("--analyse", type=Path, default=None, help=argparse.SUPPRESS)  # the per-root step
    args = parser.parse_args()
    if args.analyse is not None:
        from backends.local.model.loader import read_source  # the served model's tokenizer

        print(json.dumps(repeat_calls(json.loads(args.analyse.read_text()), read_source(args.model)[2])))
        return
    if args.before_root is None:
        parser.error("--before-root is required")
    print(f"load: {os.getloadavg()}  model: {args.model}  sessions: {args.sessions}", flush=True)
    results: dict[str, Any] = {"model": args.model, "sessions": args.sessions, "apps": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for app in args.apps.split(","):
            results["apps"][app] = {}
            for label, root in (("before", args.before_root), ("after", args.after_root)):
                commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                                        text=True).stdout.strip()
                run = measure(root.resolve(), app, args.model, args.sessions, Path(tmp) / f"{app}-{label}.log")
                results["apps"][app][label] = {"root": str(root), "commit": commit, **run}
                turn, every = run["new_user_turn"], run["all_repeat"]
                print(f"{app:26s} {label:6s} ({commit}): repeat calls with a new user turn cache "
                      f"{turn['cached_before']}/{turn['before']} = {turn['ratio']} of the tokens before it "
                      f"({turn['calls']} calls); all repeat calls {every['cached_before']}/{every['before']} = "
                      f"{every['ratio']} ({every['calls']} calls; {run['requests']} requests)", flush=True)
    print(f"load: {os.getloadavg()}", flush=True)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "tools_prefix.json").write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
