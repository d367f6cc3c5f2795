"""``kvflow serve``: start a kvflow server on the embedded engine (default), on SGLang or on vLLM.

    kvflow serve --model {smollm2-135m,tiny-random,DIR} --device-tokens N --host-tokens M
                 --policy POLICY [--no-prefetch] [--prefetch-lookahead N] [--port P] [--host H] [--api-key K]
                 [--debug-routes] [--no-learned-hints] [--engine {local,sglang,vllm}] [SGLANG OR VLLM FLAGS...]

Requests that carry no kvflow hint get a learned one (agents, sessions and who follows whom,
learned from the traffic: ``backends.learn``) unless ``--no-learned-hints``; a declared hint always
wins. The embedded engine only, for now.

The server binds 127.0.0.1 unless ``--host`` says otherwise. With ``--engine sglang`` (``vllm``) every
flag this command does not know is handed to SGLang (vLLM) untouched, through
``backends.sglang_kvflow.launcher`` (``backends.vllm_kvflow.launcher``); with the embedded engine an
unknown flag is an error.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any

from backends.kvcache import policy_names

from .startup import STARTUP_ERRORS, bind_port, min_device_tokens, non_negative_int, port_number, positive_int

__all__ = ["add_arguments", "main", "BUILTIN_MODELS"]

BUILTIN_MODELS = ("smollm2-135m", "tiny-random")
DEFAULT_PORT = 30000  # SGLang's default, so clients written for SGLang find us


def _model(value: str) -> str:
    if value in BUILTIN_MODELS or os.path.isdir(value):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                                     "nor a Hugging Face model directory")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=_model, default="smollm2-135m",
                        help="smollm2-135m, tiny-random, or a Hugging Face model directory (default: smollm2-135m)")
    parser.add_argument("--device-tokens", type=positive_int, default=None, metavar="N",
                        help="device KV pool capacity in tokens (default: the engine's)")
    parser.add_argument("--host-tokens", type=non_negative_int, default=None, metavar="M",
                        help="host KV pool capacity in tokens; 0 disables the host tier (default: the engine's)")
    parser.add_argument("--policy", choices=policy_names(online=True), default="kvflow", help="eviction policy (default: kvflow)")
    parser.add_argument("--no-prefetch", action="store_true", help="do not prefetch host KV ahead of use")
    parser.add_argument("--prefetch-lookahead", type=non_negative_int, default=None, metavar="N",
                        help="prefetch agents whose (expected) steps-to-execution are <= N (default: 1). Learned "
                             "routing sends fractional expected steps above 1 for branch candidates: a wider "
                             "lookahead (e.g. 16) lets the likeliest of them be loaded; embedded engine only")
    parser.add_argument("--dtype", choices=("auto", "float32", "bfloat16", "float16"), default=None,
                        help="weights and KV dtype (default auto: float32 on the CPU, bfloat16 on CUDA); with "
                             "--engine sglang/vllm it is passed to that engine")
    parser.add_argument("--port", type=port_number, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    parser.add_argument("--api-key", default=None, metavar="K",
                        help="require 'Authorization: Bearer K' on every route but /health")
    parser.add_argument("--debug-routes", action="store_true",
                        help="mount /kvflow/v1/debug/* (cache integrity check, hint-table size); off by default")
    parser.add_argument("--learned-hints", action=argparse.BooleanOptionalAction, default=None,
                        help="learn agents, sessions and steps from requests that carry no kvflow hint and serve "
                             "them with the learned hints; a declared hint always wins (default: on; the embedded "
                             "engine only, for now)")
    parser.add_argument("--engine", choices=("local", "sglang", "vllm"), default="local",
                        help="local: the embedded torch engine; sglang: SGLang with the kvflow plugin; "
                             "vllm: vLLM with the kvflow scheduler and routes")


# SGLang's own flags must reach SGLang: the dispatcher collects unknown arguments into
# args.extra_argv instead of rejecting them, and main() refuses them for the local engine.
PASS_THROUGH_ARGS = True


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _serve_sglang(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        from backends.sglang_kvflow import launcher
    except ImportError as exc:
        print(f"kvflow serve: --engine sglang needs the SGLang plugin (backends.sglang_kvflow.launcher) and "
              f"the sglang package ('pip install kvflow[sglang]' on a GPU machine): {exc}", file=sys.stderr)
        return 2
    return int(launcher.main(args, extra) or 0)


def _serve_vllm(args: argparse.Namespace, extra: list[str]) -> int:
    try:
        from backends.vllm_kvflow import launcher
    except ImportError as exc:
        print(f"kvflow serve: --engine vllm needs backends.vllm_kvflow.launcher: {exc}", file=sys.stderr)
        return 2
    return int(launcher.main(args, extra) or 0)


def _engine_config(args: argparse.Namespace) -> Any:
    from backends.local import EngineConfig

    sizes = {k: v for k, v in (("device_tokens", args.device_tokens), ("host_tokens", args.host_tokens),
                               ("prefetch_lookahead", args.prefetch_lookahead), ("dtype", args.dtype))
             if v is not None}
    return EngineConfig.build(model=args.model, policy=args.policy, prefetch=not args.no_prefetch, **sizes)


def main(args: argparse.Namespace) -> int:
    extra = list(getattr(args, "extra_argv", []))
    if args.engine != "local" and args.prefetch_lookahead is not None:
        print(f"kvflow serve: --prefetch-lookahead sets the embedded engine's brain; with --engine {args.engine} pass "
              "the plugin's own option (SGLang: --radix-eviction-policy-config '{\"prefetch_lookahead\": N}')",
              file=sys.stderr)
        return 2
    if args.engine != "local" and args.learned_hints:
        print(f"kvflow serve: --learned-hints runs on the embedded engine only for now, not with --engine {args.engine}",
              file=sys.stderr)
        return 2
    if args.engine != "local" and args.dtype is not None:
        extra += ["--dtype", args.dtype]  # the engine's own flag, same meaning
    if args.engine == "sglang":
        return _serve_sglang(args, extra)
    if args.engine == "vllm":
        return _serve_vllm(args, extra)
    if extra:
        print(f"kvflow serve: unrecognized arguments: {' '.join(extra)} (only --engine sglang/vllm pass flags through)",
              file=sys.stderr)
        return 2
    if not _is_loopback(args.host) and not args.api_key:
        print(f"kvflow serve: warning: binding {args.host} without --api-key exposes the server to the network",
              file=sys.stderr)
    try:
        sock = bind_port(args.host, args.port)  # before the model loads: a busy port fails in a second
    except OSError as exc:
        print(f"kvflow serve: {exc}", file=sys.stderr)
        return 2
    with sock:
        return _serve_local(args, sock)


def _serve_local(args: argparse.Namespace, sock: Any) -> int:
    import uvicorn

    from backends.local import Engine
    from backends.server import create_app

    print(f"kvflow serve: loading {args.model}...", file=sys.stderr, flush=True)
    try:
        engine = Engine(_engine_config(args))
    except STARTUP_ERRORS as exc:
        print(f"kvflow serve: cannot start the engine: {exc}", file=sys.stderr)
        return 2
    minimum = min_device_tokens(engine.tokenizer)
    if engine.config.cache.device_tokens < minimum:
        engine.close()
        print(f"kvflow serve: --device-tokens {engine.config.cache.device_tokens} cannot hold even the smallest "
              f"request ({minimum} tokens with {args.model}'s chat template); use at least {minimum}, and "
              "thousands to keep agents' prompts cached", file=sys.stderr)
        return 2
    learner = None
    if args.learned_hints is not False:
        from backends.learn import TrafficLearner

        learner = TrafficLearner()
    app = create_app(engine, api_key=args.api_key, debug_routes=args.debug_routes, learner=learner)
    print(f"kvflow serve: {args.model} on http://{args.host}:{args.port} (policy {args.policy}, "
          f"prefetch {'off' if args.no_prefetch else 'on'}, lookahead {engine.config.cache.prefetch_lookahead}, "
          f"learned hints {'off' if learner is None else 'on'})", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled; the shutdown was clean
        pass
    return 0 if server.started else 1
