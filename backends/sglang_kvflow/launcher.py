"""``kvflow serve --engine sglang``: start SGLang's own server with the kvflow plugin.

    kvflow serve --engine sglang --model HF_DIR [--policy kvflow|lru] [--device-tokens N]
                 [--host-tokens M] [--no-prefetch] [--port P] [--host H] [--api-key K] [SGLANG FLAGS...]
    python -m backends.sglang_kvflow.launcher (same flags) [--tree-core python|rust]

``kvflow`` (default): HiCache on, write-through, ``--radix-eviction-policy kvflow``, the plugin
loaded in every SGLang process through its entry point. ``lru``: stock SGLang (the plugin stays
off), for side-by-side comparisons; add ``--enable-hierarchical-cache`` for stock HiCache. Every
flag kvflow does not know goes to SGLang unchanged, after ours, so it wins.

The kvflow policy needs SGLang's Python radix tree core (it tags nodes); stock SGLang defaults to
its Rust core. ``tree_core="python"`` runs a stock baseline on the same core, so a comparison
measures the policy, not the core. SGLang chooses the core by environment variable only.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from backends.launch import LaunchPlan, ServeOptions, run_plan, serve_options
from backends.learn.host import learned_hints_env
from . import DISABLE_ENV, POLICY_NAME, TREE_CORE_ENV

__all__ = ["LaunchPlan", "build_command", "plan_from_args", "parse_args", "main", "TREE_CORES"]

BUILTIN_NAMES = ("smollm2-135m", "tiny-random")
TREE_CORES = ("python", "rust")


def build_command(model: str, extra_argv: Sequence[str] = (), *, tree_core: str | None = None,
                  python: str = sys.executable, continuations: bool = True, **options: Any) -> LaunchPlan:
    """Build the ``python -m sglang.launch_server`` command; ``options`` are
    :class:`~backends.launch.ServeOptions` fields; ``continuations``: keep conversations across tool
    pauses (the policy option of that name). Raises ValueError on a combination SGLang cannot
    express (or refuses at start-up)."""
    policy, host, port, api_key, device_tokens, host_tokens, prefetch = ServeOptions(**options)
    if policy not in (POLICY_NAME, "lru"):
        raise ValueError(f"policy must be 'kvflow' or 'lru', got {policy!r}")
    if tree_core is not None and tree_core not in TREE_CORES:
        raise ValueError(f"tree core must be one of {', '.join(TREE_CORES)}, got {tree_core!r}")
    if policy == POLICY_NAME and tree_core == "rust":
        raise ValueError("the kvflow policy needs the Python radix tree core (it tags tree nodes); "
                         "use --tree-core python or --policy lru")
    if policy == POLICY_NAME and host_tokens != 0 and "--disable-radix-cache" in extra_argv:
        raise ValueError("--disable-radix-cache turns off the prefix cache kvflow manages, and SGLang refuses it "
                         "with the hierarchical cache: drop it, or pass --host-tokens 0 (no host tier)")
    if model in BUILTIN_NAMES:
        raise ValueError(f"SGLang serves Hugging Face model directories, not the built-in {model!r}: "
                         f"write one with 'kvflow export-model {model} DIR' and pass --model DIR")
    argv = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host, "--port", str(port)]
    env: dict[str, str] = {}
    if device_tokens is not None:
        argv += ["--max-total-tokens", str(device_tokens)]
    if host_tokens is not None and host_tokens > 0:
        if device_tokens is None:
            raise ValueError("--host-tokens needs --device-tokens with --engine sglang: SGLang sizes its "
                             "host pool as a ratio of the device pool (--hicache-ratio)")
        argv += ["--hicache-ratio", f"{host_tokens / device_tokens:g}"]
    if policy == POLICY_NAME:
        if host_tokens != 0:  # 0 means no host tier: eviction order still applies, nothing to prefetch
            argv += ["--enable-hierarchical-cache", "--hicache-write-policy", "write_through"]
        argv += ["--radix-eviction-policy", POLICY_NAME]
        config = {**({} if prefetch else {"prefetch": False}), **({} if continuations else {"continuations": False})}
        if config:
            argv += ["--radix-eviction-policy-config", json.dumps(config)]
        env[TREE_CORE_ENV] = "python"
    else:
        argv += ["--radix-eviction-policy", "lru"]
        env[DISABLE_ENV] = "off"
        if tree_core is not None:
            env[TREE_CORE_ENV] = tree_core
    if api_key:
        argv += ["--api-key", api_key]
    argv += list(extra_argv)
    return LaunchPlan(argv, env)


def plan_from_args(args: argparse.Namespace, extra_argv: Sequence[str]) -> LaunchPlan:
    """From ``kvflow serve``'s parsed arguments (attributes it may lack take their defaults)."""
    plan = build_command(args.model, extra_argv, **serve_options(args, POLICY_NAME),
                         tree_core=getattr(args, "tree_core", None),
                         continuations=bool(getattr(args, "continuations", True)))
    plan.env.update(learned_hints_env(bool(getattr(args, "learned_hints", False))))  # read by the plugin's routes
    return plan


def main(args: argparse.Namespace, extra_argv: Sequence[str] = ()) -> int:
    """Run SGLang in the foreground; returns its exit status (2 for a usage error)."""
    return run_plan(lambda: plan_from_args(args, extra_argv), package="sglang",
                    missing="--engine sglang needs the sglang package (pip install 'kvflow[sglang]' on a "
                            "CUDA machine); this Python has none")


def parse_args(argv: Sequence[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    """The standalone launcher's flags (``kvflow serve --engine sglang``'s, plus ``--tree-core``);
    unknown flags are returned for SGLang."""
    parser = argparse.ArgumentParser(prog="python -m backends.sglang_kvflow.launcher",
                                     description="SGLang with the kvflow plugin "
                                                 "(same flags as kvflow serve --engine sglang)")
    parser.add_argument("--model", required=True)
    parser.add_argument("--policy", choices=(POLICY_NAME, "lru"), default=POLICY_NAME)
    parser.add_argument("--device-tokens", type=int)
    parser.add_argument("--host-tokens", type=int)
    parser.add_argument("--no-prefetch", action="store_true")
    parser.add_argument("--continuations", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--api-key")
    parser.add_argument("--tree-core", choices=TREE_CORES,
                        help="SGLang's radix tree core (kvflow needs python; give stock runs the same)")
    parser.add_argument("--dry-run", action="store_true", help="print the environment and command, start nothing")
    return parser.parse_known_args(argv)


def _standalone(argv: Sequence[str] | None = None) -> int:
    args, extra = parse_args(argv)
    if args.dry_run:
        try:
            plan = plan_from_args(args, extra)
        except ValueError as exc:
            print(f"launcher: {exc}", file=sys.stderr)
            return 2
        print(json.dumps({"env": plan.env, "argv": plan.argv}))
        return 0
    return main(args, extra)


if __name__ == "__main__":
    raise SystemExit(_standalone())
