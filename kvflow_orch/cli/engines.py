"""The engines ``kvflow serve --engine NAME`` starts: a registry, as the brain's eviction policies are.

An engine is a name, a line of help and a launcher, ``launch(args, extra_argv) -> exit status``,
given ``kvflow serve``'s parsed flags. External engines (SGLang, vLLM) run their own server with the
kvflow plugin: the flags ``kvflow serve`` does not know go to them untouched and ``--dtype`` is
passed on as theirs. The embedded engine refuses unknown flags. Adding an engine is one
:func:`register_engine` call; its launcher imports its host when it runs, so ``kvflow serve --help``
loads none of them.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys
from types import ModuleType
from typing import Any, Callable, NamedTuple

from .startup import STARTUP_ERRORS, bind_port, min_device_tokens

__all__ = ["ServeEngine", "Launcher", "register_engine", "engine_names", "get_engine"]

Launcher = Callable[[argparse.Namespace, list[str]], int]


class ServeEngine(NamedTuple):
    name: str
    help: str
    """One line for ``kvflow serve --help``."""
    launch: Launcher
    external: bool = True
    """Runs another project's server: unknown flags and ``--dtype`` go to it."""


_ENGINES: dict[str, ServeEngine] = {}


def register_engine(engine: ServeEngine) -> ServeEngine:
    if engine.name in _ENGINES:
        raise ValueError(f"engine {engine.name!r} is already registered")
    _ENGINES[engine.name] = engine
    return engine


def engine_names(*, external: bool | None = None) -> tuple[str, ...]:
    """Registered names, in registration order; ``external`` keeps only those of that kind."""
    return tuple(name for name, e in _ENGINES.items() if external is None or e.external == external)


def get_engine(name: str) -> ServeEngine:
    try:
        return _ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown engine {name!r}; choose from {', '.join(_ENGINES)}") from None


# ---- the embedded engine behind kvflow's own server -----------------------------------------
def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _allowed_hosts(args: argparse.Namespace) -> tuple[str, ...] | None:
    """``--allowed-hosts`` for ``create_app``: ``None`` (any Host) for ``*``; unset, the loopback
    names on a loopback bind (what DNS rebinding needs is another name) and any Host elsewhere."""
    from backends.server.crosssite import LOOPBACK_HOSTS

    given = getattr(args, "allowed_hosts", None)
    if given is None:
        return LOOPBACK_HOSTS if _is_loopback(args.host) else None
    return None if given == ("*",) else given


def _embedded_config(args: argparse.Namespace) -> Any:
    """The embedded engine's config from ``kvflow serve``'s flags (unset ones keep the engine's defaults)."""
    from backends.local import EngineConfig

    sizes = {k: v for k, v in (("device_tokens", args.device_tokens), ("host_tokens", args.host_tokens),
                               ("prefetch_lookahead", args.prefetch_lookahead), ("dtype", args.dtype))
             if v is not None}
    return EngineConfig.build(model=args.model, policy=args.policy, prefetch=not args.no_prefetch,
                              continuations=args.continuations, **sizes)


def _serve_embedded(args: argparse.Namespace, extra: list[str]) -> int:
    if extra:
        print(f"kvflow serve: unrecognized arguments: {' '.join(extra)} (only --engine "
              f"{'/'.join(engine_names(external=True))} pass flags through)", file=sys.stderr)
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
        return _run_server(args, sock)


def _run_server(args: argparse.Namespace, sock: Any) -> int:
    import uvicorn

    from backends.local import Engine
    from backends.server import create_app

    print(f"kvflow serve: loading {args.model}...", file=sys.stderr, flush=True)
    try:
        engine = Engine(_embedded_config(args))
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
    if getattr(args, "learned_hints", False):
        from backends.learn import TrafficLearner

        learner = TrafficLearner()
    app = create_app(engine, api_key=args.api_key, debug_routes=args.debug_routes, learner=learner,
                     allowed_hosts=_allowed_hosts(args))
    print(f"kvflow serve: {args.model} on http://{args.host}:{args.port} (policy {args.policy}, "
          f"prefetch {'off' if args.no_prefetch else 'on'}, lookahead {engine.config.cache.prefetch_lookahead}), "
          f"learned hints {'off' if learner is None else 'on'}, "
          f"continuations {'on' if engine.config.cache.continuations else 'off'}", file=sys.stderr, flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="info"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled; the shutdown was clean
        pass
    return 0 if server.started else 1


# ---- external engines: their own server, the kvflow plugin inside ----------------------------
def _plugin_launcher(load: Callable[[], ModuleType], needs: str) -> Launcher:
    """A launcher that imports the plugin's launcher module (``load``) when it runs, since the
    plugin's engine may not be installed here, and hands it the flags."""
    def launch(args: argparse.Namespace, extra: list[str]) -> int:
        try:
            launcher = load()
        except ImportError as exc:
            print(f"kvflow serve: --engine {args.engine} needs {needs}: {exc}", file=sys.stderr)
            return 2
        return int(launcher.main(args, extra) or 0)

    return launch


def _sglang_launcher() -> ModuleType:
    from backends.sglang_kvflow import launcher

    return launcher


def _vllm_launcher() -> ModuleType:
    from backends.vllm_kvflow import launcher

    return launcher


register_engine(ServeEngine("local", "the embedded torch engine", _serve_embedded, external=False))
register_engine(ServeEngine("sglang", "SGLang with the kvflow plugin", _plugin_launcher(
    _sglang_launcher, "the SGLang plugin (backends.sglang_kvflow.launcher) and the sglang package "
                      "('pip install kvflow[sglang]' on a GPU machine)")))
register_engine(ServeEngine("vllm", "vLLM with the kvflow scheduler and routes", _plugin_launcher(
    _vllm_launcher, "backends.vllm_kvflow.launcher")))
