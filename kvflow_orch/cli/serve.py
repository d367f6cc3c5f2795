"""``kvflow serve``: start a kvflow server on the embedded engine (default), on SGLang or on vLLM.

    kvflow serve --model {smollm2-135m,tiny-random,DIR} --device-tokens N --host-tokens M
                 --policy POLICY [--no-prefetch] [--port P] [--host H] [--api-key K]
                 [--debug-routes] [--engine {local,sglang,vllm}] [SGLANG OR VLLM FLAGS...]

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

__all__ = ["add_arguments", "main", "BUILTIN_MODELS"]

BUILTIN_MODELS = ("smollm2-135m", "tiny-random")
DEFAULT_PORT = 30000  # SGLang's default, so clients written for SGLang find us


def _model(value: str) -> str:
    if value in BUILTIN_MODELS or os.path.isdir(value):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is neither a built-in model ({', '.join(BUILTIN_MODELS)}) "
                                     "nor a Hugging Face model directory")


def _positive(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {number}")
    return number


def _non_negative(value: str) -> int:
    number = int(value)
    if number < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {number}")
    return number


def _port(value: str) -> int:
    number = int(value)
    if not 0 < number < 65536:
        raise argparse.ArgumentTypeError(f"port must be in 1..65535, got {number}")
    return number


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", type=_model, default="smollm2-135m",
                        help="smollm2-135m, tiny-random, or a Hugging Face model directory (default: smollm2-135m)")
    parser.add_argument("--device-tokens", type=_positive, default=None, metavar="N",
                        help="device KV pool capacity in tokens (default: the engine's)")
    parser.add_argument("--host-tokens", type=_non_negative, default=None, metavar="M",
                        help="host KV pool capacity in tokens; 0 disables the host tier (default: the engine's)")
    parser.add_argument("--policy", choices=policy_names(online=True), default="kvflow", help="eviction policy (default: kvflow)")
    parser.add_argument("--no-prefetch", action="store_true", help="do not prefetch host KV ahead of use")
    parser.add_argument("--port", type=_port, default=DEFAULT_PORT, help=f"port (default: {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1, loopback only)")
    parser.add_argument("--api-key", default=None, metavar="K",
                        help="require 'Authorization: Bearer K' on every route but /health")
    parser.add_argument("--debug-routes", action="store_true",
                        help="mount /kvflow/v1/debug/* (cache integrity check, hint-table size); off by default")
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

    sizes = {k: v for k, v in (("device_tokens", args.device_tokens), ("host_tokens", args.host_tokens)) if v is not None}
    return EngineConfig.build(model=args.model, policy=args.policy, prefetch=not args.no_prefetch, **sizes)


def main(args: argparse.Namespace) -> int:
    extra = list(getattr(args, "extra_argv", []))
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
    import uvicorn

    from backends.local import Engine
    from backends.server import create_app

    try:
        engine = Engine(_engine_config(args))
    except (ValueError, OSError) as exc:
        print(f"kvflow serve: cannot start the engine: {exc}", file=sys.stderr)
        return 2
    app = create_app(engine, api_key=args.api_key, debug_routes=args.debug_routes)
    print(f"kvflow serve: {args.model} on http://{args.host}:{args.port} (policy {args.policy}, "
          f"prefetch {'off' if args.no_prefetch else 'on'})", file=sys.stderr, flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0
