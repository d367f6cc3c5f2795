"""``kvflow cluster``: N local ``kvflow serve`` workers and SGLang's model gateway (``smg``) in front.

    kvflow cluster --workers N --model M [--gateway-port P] [--gateway-policy POLICY] [SERVE FLAGS...]

For development and tests on one machine: every process binds 127.0.0.1. Serve flags
(``--device-tokens``, ``--host-tokens``, ``--policy``, ``--no-prefetch``, ``--debug-routes``,
``--api-key``, ``--learned-hints``) go to every worker.

Learned hints are learned on the workers, each from the requests it serves, not at the gateway: a
hint acts on the cache of the worker that serves its request, which is where the session's KV is,
and what a learner links into a session (its conversation, the replies it carries) is what that
worker has seen. smg passes bodies and headers through and runs no learner. So keep a session on one
worker, for its cache as for its learning: smg's ``manual`` policy pins the requests that carry
``x-smg-routing-key`` (kvflow's clients send it); a session split over workers is learned, and
cached, in pieces. It prints one line per worker (``worker I: URL``) and then
``gateway: URL``, and runs until Ctrl-C (or SIGTERM) or until the gateway exits; then it stops them all.
A worker that exits is started again on its port (``--restart-delay`` doubling up to
``--restart-max-delay`` while it keeps exiting); the gateway routes around it meanwhile and takes
it back once it answers ``/health`` (one line on stderr for each exit, restart and return). In
production each worker is ``kvflow serve`` (or ``--engine sglang``) on its own GPU and ``smg launch``
runs in front. smg is an optional extra: ``pip install 'kvflow[smg]'``.

The workers and the gateway are started and stopped by :mod:`kvflow_orch.harness.cluster`.
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

from ..harness.cluster import GATEWAY_POLICIES, RestartPolicy, Supervisor, find_smg, start_cluster
from . import serve
from .startup import port_number, positive_int

__all__ = ["add_arguments", "main"]

PASS_THROUGH_ARGS = True
_OWN_FLAGS = ("--port", "--host", "--model", "--engine")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=positive_int, required=True, metavar="N", help="how many workers to start")
    parser.add_argument("--model", type=serve._model, required=True,
                        help="smollm2-135m, tiny-random, or a Hugging Face model directory")
    parser.add_argument("--gateway-port", type=port_number, default=serve.DEFAULT_PORT, metavar="P",
                        help=f"the gateway's port (default: {serve.DEFAULT_PORT}); workers take free ports")
    parser.add_argument("--gateway-policy", choices=GATEWAY_POLICIES, default="manual",
                        help="smg's routing policy (default: manual, sticky by the x-smg-routing-key header)")
    parser.add_argument("--startup-timeout", type=positive_int, default=300, metavar="S",
                        help="seconds to wait for the workers and the gateway (default: 300)")
    default = RestartPolicy()
    parser.add_argument("--restart-delay", type=_seconds, default=default.first_delay_s, metavar="S",
                        help=f"seconds before a worker that exited starts again (default: {default.first_delay_s}); "
                             "doubles with each exit in a row")
    parser.add_argument("--restart-max-delay", type=_seconds, default=default.max_delay_s, metavar="S",
                        help=f"the longest wait before a restart (default: {default.max_delay_s})")


def _seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {value!r}") from None
    if not 0 <= seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {value}")
    return seconds


def _serve_flags(args: argparse.Namespace) -> list[str]:
    """The pass-through flags, checked by ``kvflow serve``'s own parser (errors name the flag)."""
    extra = list(getattr(args, "extra_argv", []))
    for flag in extra:
        if flag.split("=", 1)[0] in _OWN_FLAGS:
            raise ValueError(f"{flag.split('=', 1)[0]} is set by kvflow cluster for every worker; remove it")
    parser = argparse.ArgumentParser(prog="kvflow cluster (serve flags)", add_help=False)
    serve.add_arguments(parser)
    parsed, unknown = parser.parse_known_args(extra)
    if unknown:
        raise ValueError(f"unrecognized arguments: {' '.join(unknown)}")
    if parsed.engine != "local":
        raise ValueError("kvflow cluster starts embedded-engine workers only")
    return extra


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


def main(args: argparse.Namespace) -> int:
    try:
        flags = _serve_flags(args)
        if args.restart_delay > args.restart_max_delay:
            raise ValueError(f"--restart-delay ({args.restart_delay:g} s) exceeds --restart-max-delay "
                             f"({args.restart_max_delay:g} s)")
        policy = RestartPolicy(args.restart_delay, args.restart_max_delay)
    except ValueError as exc:
        print(f"kvflow cluster: {exc}", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGHUP):  # stop the children on `kill` as on Ctrl-C
        signal.signal(signum, _interrupt)
    if find_smg() is None:
        print("kvflow cluster: smg (SGLang's model gateway) is not installed: pip install 'kvflow[smg]'",
              file=sys.stderr)
        return 2
    try:
        with start_cluster(args.workers, args.model, flags, gateway_port=args.gateway_port,
                           gateway_policy=args.gateway_policy, startup_timeout_s=args.startup_timeout,
                           log=sys.stderr) as cluster:  # stdout carries only the URLs
            for i, url in enumerate(cluster.workers):
                print(f"worker {i}: {url}", flush=True)
            print(f"gateway: {cluster.gateway}", flush=True)
            code = Supervisor(cluster, policy, log=sys.stderr).run()
            print(f"kvflow cluster: the gateway exited with code {code}; stopping the workers", file=sys.stderr)
            return 1
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, OSError) as exc:
        print(f"kvflow cluster: {exc}", file=sys.stderr)
        return 1
