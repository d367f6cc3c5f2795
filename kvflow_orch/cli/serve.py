"""``kvflow serve``: start a kvflow server on the embedded engine (default), on SGLang or on vLLM.

    kvflow serve --model {smollm2-135m,tiny-random,DIR} --device-tokens N --host-tokens M
                 --policy POLICY [--no-prefetch] [--prefetch-lookahead N] [--port P] [--host H] [--api-key K]
                 [--allowed-hosts NAME,...] [--debug-routes] [--learned-hints] [--engine {local,sglang,vllm}]
                 [SGLANG OR VLLM FLAGS...]

With ``--learned-hints``, requests that carry no kvflow hint get a learned one (agents, sessions and
who follows whom, learned from the traffic: ``backends.learn``); a declared hint always wins. On
every engine: the embedded server's routes call the learner, the vLLM and SGLang plugins run it
as a middleware (``backends.learn.asgi``, switched on by ``KVFLOW_LEARNED_HINTS``).

The server binds 127.0.0.1 unless ``--host`` says otherwise. On loopback it answers only requests
whose Host header is a loopback name and refuses web pages of other hosts (``--allowed-hosts``:
DNS rebinding and cross-site requests; see SECURITY.md). With ``--engine sglang`` (``vllm``) every
flag this command does not know is handed to SGLang (vLLM) untouched, through
``backends.sglang_kvflow.launcher`` (``backends.vllm_kvflow.launcher``); with the embedded engine an
unknown flag is an error. The engines come from a registry (:mod:`.engines`).
"""

from __future__ import annotations

import argparse
import os
import sys

from backends.kvcache import policy_names

from .engines import engine_names, get_engine
from .startup import non_negative_int, port_number, positive_int

__all__ = ["add_arguments", "main", "BUILTIN_MODELS"]

BUILTIN_MODELS = ("smollm2-135m", "tiny-random")
DEFAULT_PORT = 30000  # SGLang's default, so clients written for SGLang find us


def _model(value: str) -> str:
    if value in BUILTIN_MODELS or os.path.isdir(value):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                                     "nor a Hugging Face model directory")


def _host_list(value: str) -> tuple[str, ...]:
    """``--allowed-hosts``: comma-separated names, or ``*`` alone (any Host)."""
    names = tuple(name.strip() for name in value.split(","))
    if names == ("*",):
        return names
    if not all(names) or "*" in names:
        raise argparse.ArgumentTypeError(f"must be host names separated by commas, or '*' alone; got {value!r}")
    return names


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=_model, default="smollm2-135m",
                        help="smollm2-135m, tiny-random, or a Hugging Face model directory (default: smollm2-135m)")
    parser.add_argument("--device-tokens", type=positive_int, default=None, metavar="N",
                        help="device KV pool capacity in tokens (default: the engine's)")
    parser.add_argument("--host-tokens", type=non_negative_int, default=None, metavar="M",
                        help="host KV pool capacity in tokens; 0 disables the host tier (default: the engine's)")
    parser.add_argument("--policy", choices=policy_names(online=True), default="kvflow",
                        help="eviction policy (default: kvflow)")
    parser.add_argument("--no-prefetch", action="store_true", help="do not prefetch host KV ahead of use")
    parser.add_argument("--prefetch-lookahead", type=non_negative_int, default=None, metavar="N",
                        help="prefetch agents whose (expected) steps-to-execution are <= N (default: 1). Learned "
                             "routing sends fractional expected steps above 1 for branch candidates: a wider "
                             "lookahead (e.g. 16) lets the likeliest of them be loaded; embedded engine only")
    parser.add_argument("--continuations", action=argparse.BooleanOptionalAction, default=True,
                        help="keep a conversation across its agent's tool pause (a reply ending in tool calls, a "
                             "hint's resume_in_s) until a deadline learned per tool; the session is the hint's "
                             "agent or the request's user / prompt_cache_key (default: on; any engine's kvflow policy)")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default=None,
                        help="weights and KV dtype (default auto: float32 on the CPU, bfloat16 on CUDA); with "
                             "--engine sglang/vllm it is passed to that engine")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    parser.add_argument("--api-key", default=None, metavar="K",
                        help="require 'Authorization: Bearer K' on every route but /health (non-empty)")
    parser.add_argument("--allowed-hosts", type=_host_list, default=None, metavar="NAME,...",
                        help="names the Host header and a browser's Origin may carry (against DNS rebinding and "
                             "cross-site requests); '*' accepts any Host (default: localhost,127.0.0.1,::1 when "
                             "--host is loopback, '*' otherwise); embedded engine only")
    parser.add_argument("--debug-routes", action="store_true",
                        help="mount /kvflow/v1/debug/* (cache integrity check, hint-table size); off by default")
    parser.add_argument("--learned-hints", action=argparse.BooleanOptionalAction, default=False,
                        help="learn agents, sessions and steps from requests that carry no kvflow hint and serve "
                             "them with the learned hints; a declared hint always wins (default: off until one "
                             "benchmark run meets issue 23's no-harm and cost targets together, see README)")
    parser.add_argument("--engine", choices=engine_names(), default="local",
                        help="; ".join(f"{name}: {get_engine(name).help}" for name in engine_names()))


# SGLang's own flags must reach SGLang: the dispatcher collects unknown arguments into
# args.extra_argv instead of rejecting them, and the embedded engine's launcher refuses them.
PASS_THROUGH_ARGS = True


def main(args: argparse.Namespace) -> int:
    extra = list(getattr(args, "extra_argv", []))
    engine = get_engine(args.engine)
    if args.api_key is not None:
        from backends.server.auth import key_problem

        problem = key_problem(args.api_key)
        if problem is not None:  # refused here: a server with it would answer every route with an error
            print(f"kvflow serve: --api-key: {problem}", file=sys.stderr)
            return 2
    if engine.external and args.allowed_hosts is not None:
        print(f"kvflow serve: --allowed-hosts guards the embedded server; with --engine {args.engine} use that "
              "server's own settings", file=sys.stderr)
        return 2
    if engine.external and args.prefetch_lookahead is not None:
        print(f"kvflow serve: --prefetch-lookahead sets the embedded engine's brain; with --engine {args.engine} pass "
              "the plugin's own option (SGLang: --radix-eviction-policy-config '{\"prefetch_lookahead\": N}')",
              file=sys.stderr)
        return 2
    if args.engine == "sglang" and args.learned_hints and args.policy != "kvflow":
        print("kvflow serve: --learned-hints with --engine sglang needs --policy kvflow (the plugin that applies "
              "hints is off with any other policy)", file=sys.stderr)
        return 2
    if engine.external and not args.continuations and args.policy != "kvflow":
        print(f"kvflow serve: --no-continuations turns off the kvflow policy's continuations; with --engine "
              f"{args.engine} --policy {args.policy} the stock engine keeps none", file=sys.stderr)
        return 2
    if engine.external and args.dtype is not None:
        extra += ["--dtype", args.dtype]  # the engine's own flag, same meaning
    return engine.launch(args, extra)
