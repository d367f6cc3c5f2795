"""Run an agent framework's app (``tests/frameworks/apps/*.py``) in its own venv against a server
the way users start it, and read what the server itself counted (``/metrics``), so a test judges
the server by its answers, not by the framework not raising."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator, NamedTuple, Sequence

import httpx

ROOT = Path(__file__).resolve().parents[2]
APPS = Path(__file__).resolve().parent / "apps"
SETUP = "bash .ci/setup-frameworks"
VENVS = {"frameworks": ROOT / ".venv-frameworks", "crewai": ROOT / ".venv-crewai"}
_COUNTER = re.compile(r'^kvflow_http_requests_total\{method="(\w+)",path="([^"]+)",status="(\d+)"\} ([0-9.e+]+)$', re.M)


def venv_python(venv: str) -> Path | None:
    """The venv's interpreter once ``.ci/setup-frameworks`` has built it (``None`` before)."""
    python = VENVS[venv] / "bin" / "python"
    return python if (VENVS[venv] / ".kvflow-frameworks-ready").exists() and python.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def app_on_loopback(app: object, timeout_s: float = 300) -> Iterator[str]:
    """An ASGI ``app`` served by uvicorn on a free 127.0.0.1 port in a thread of this process (its
    lifespan run: an engine it manages starts and stops with it); yields its root URL."""
    import threading
    import time

    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    try:
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the app on port {port} did not start")
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=120)


@contextlib.contextmanager
def kvflow_serve(flags: Sequence[str], log: Path, timeout_s: float = 300) -> Iterator[str]:
    """``kvflow serve FLAGS`` as a subprocess on 127.0.0.1 (this worktree's code); yields its root URL."""
    from backends.vllm_kvflow.launcher import running  # the generic "start, wait for /health, stop" helper

    port = free_port()
    argv = [sys.executable, "-m", "kvflow_orch.cli", "serve", "--port", str(port), *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with running(argv, f"http://127.0.0.1:{port}", log, env=env, cwd=ROOT, timeout_s=timeout_s) as url:
        yield url


class AppRun(NamedTuple):
    summary: dict
    """The JSON line the app printed last."""
    output: str


def run_app(venv: Path, app: str, base_url: str, *args: str, timeout_s: float = 900) -> AppRun:
    """``python apps/<app>.py --base-url URL ARGS`` in ``venv``; fails with the app's output unless
    it exits 0 having printed its summary."""
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH", "OPENAI_API_KEY")}
    proc = subprocess.run([str(venv), str(APPS / f"{app}.py"), "--base-url", base_url, *args], env=env,
                          capture_output=True, text=True, timeout=timeout_s, cwd=APPS)
    output = proc.stdout + proc.stderr
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and lines, f"{app} exited {proc.returncode}:\n{output[-6000:]}"
    return AppRun(json.loads(lines[-1]), output)


def http_counts(url: str, headers: dict[str, str] | None = None) -> dict[tuple[str, str, int], float]:
    """``(method, path, status) -> answers`` from the server's ``/metrics``."""
    text = httpx.get(url + "/metrics", headers=headers, timeout=30).text
    return {(m, p, int(s)): float(n) for m, p, s, n in _COUNTER.findall(text)}


def answered_since(before: dict[tuple[str, str, int], float],
                   after: dict[tuple[str, str, int], float]) -> dict[tuple[str, str, int], float]:
    """What the server answered between two :func:`http_counts` snapshots (``/metrics`` itself left out)."""
    return {key: n - before.get(key, 0.0) for key, n in after.items()
            if n > before.get(key, 0.0) and key[1] != "/metrics"}


_ACCESS = re.compile(r'"(GET|POST|HEAD|PUT|DELETE) (\S+) HTTP/[0-9.]+" (\d{3})')


def logged_answers(log: Path, since: int = 0) -> list[tuple[str, str, int]]:
    """``(method, path, status)`` of every request in a server's access log (uvicorn's, which both
    ``kvflow serve`` and vLLM write) past byte ``since``."""
    text = log.read_bytes()[since:].decode(errors="replace")
    return [(m, p.split("?")[0], int(s)) for m, p, s in _ACCESS.findall(text)]
