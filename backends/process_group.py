"""Run a server and every process it starts as one unit, so that stopping it leaves nothing behind.

External engines start helpers of their own (vLLM: API server, EngineCore, worker; SGLang:
scheduler, detokenizer). Each server started here leads a new session, which every process it
starts inherits, so "stopped" means "no process of its session is left", whatever the engine's own
shutdown does. Stopping is: the signal to the leader (the engine shuts its helpers down itself, as
under any process manager), up to :data:`STOP_GRACE_S` for the whole session to exit, then SIGKILL
to every process still in it. Linux reads session members from /proc; elsewhere the process group
(the same processes unless one moved itself) is signalled instead.

Not a host: the launchers (``kvflow serve --engine ...``), the cluster supervisor and the benchmarks
use it. Standard library only.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

__all__ = ["STOP_GRACE_S", "start", "stop", "run_foreground", "session_members"]

STOP_GRACE_S = 5.0
"""Seconds a server has, after the stop signal, before what is left of it is killed."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
_POLL_S = 0.05
_KILLED_WAIT_S = 2.0  # SIGKILLed processes vanish in milliseconds; a bound in case one is stuck in the kernel
_PR_SET_PDEATHSIG = 1


def _death_signal_setter() -> Callable[[], None] | None:
    """A function for the child to run before exec: SIGTERM to it when its parent dies, even by
    SIGKILL (Linux's PR_SET_PDEATHSIG); None where that does not exist. Looked up in the parent, so
    the forked child only makes the call."""
    if sys.platform != "linux":
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def set_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the call took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return set_death_signal


def start(argv: Sequence[str], *, die_with_parent: bool = False, **popen: Any) -> subprocess.Popen[bytes]:
    """Start ``argv`` as the leader of a new session (``popen``: ``subprocess.Popen``'s keywords).
    ``die_with_parent``: the leader gets SIGTERM if this process dies without stopping it (Linux;
    the parent is the calling thread, so call it from one that lives as long as the server)."""
    preexec = _death_signal_setter() if die_with_parent else None
    return subprocess.Popen(list(argv), start_new_session=True, preexec_fn=preexec, **popen)


def session_members(session: int) -> list[int]:
    """Live (not zombie) processes of ``session``, from /proc; [] where /proc is absent."""
    members = []
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                with open(f"/proc/{entry.name}/stat", "rb") as f:
                    stat = f.read()
            except OSError:  # it exited while we looked
                continue
            # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses
            fields = stat[stat.rindex(b")") + 2:].split()
            if fields[0] != b"Z" and int(fields[3]) == session:
                members.append(int(entry.name))
    return members


def _running(session: int) -> bool:
    if os.path.isdir("/proc"):
        return bool(session_members(session))
    try:
        os.killpg(session, 0)  # the group stands in for the session without /proc
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_session(session: int, signum: int) -> None:
    for pid in session_members(session):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(session, signum)


def stop(procs: Sequence[subprocess.Popen[Any]], *, signum: int = signal.SIGTERM,
         grace_s: float = STOP_GRACE_S) -> None:
    """Stop the sessions :func:`start` began, all at once: ``signum`` to each leader still running
    (to the rest of its session where the leader is gone), up to ``grace_s`` for every process of
    them to exit, then SIGKILL to what is left, and the leaders reaped. An interrupt while waiting
    (a second Ctrl-C) skips to the SIGKILL."""
    sessions = [proc.pid for proc in procs]
    try:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)
            else:
                _signal_session(proc.pid, signum)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            for proc in procs:
                proc.poll()  # a reaped leader no longer counts as running
            if not any(_running(session) for session in sessions):
                break
            time.sleep(_POLL_S)
    finally:
        for session in sessions:
            _signal_session(session, signal.SIGKILL)
        for proc in procs:
            proc.wait()
        deadline = time.monotonic() + _KILLED_WAIT_S
        while any(_running(session) for session in sessions) and time.monotonic() < deadline:
            time.sleep(_POLL_S)


def _exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode  # killed by signal N: 128+N, as a shell says


def run_foreground(argv: Sequence[str], *, env: dict[str, str] | None = None) -> int:
    """Run ``argv`` in its own session until it exits, as if it were this process: SIGTERM, SIGINT
    and SIGHUP received here go to it (SIGHUP as SIGTERM), then :func:`stop` makes sure nothing of
    it outlives this call; a second signal kills it at once. Returns its exit status (128+N for a
    death by signal N)."""
    received: list[int] = []

    def on_signal(signum: int, frame: Any) -> None:
        received.append(signum)
        # the second one: stop() skips the grace period. Later ones only count: raised inside the
        # SIGKILL pass, they would cut it short and leave helpers running (process managers and
        # wrappers such as `timeout` send a signal more than once).
        if len(received) == 2:
            raise KeyboardInterrupt

    previous = {signum: signal.signal(signum, on_signal) for signum in FORWARDED}
    try:
        proc = start(argv, env=env, die_with_parent=True)
        try:
            while proc.poll() is None and not received:
                time.sleep(_POLL_S)
            first = received[0] if received else signal.SIGTERM
            stop([proc], signum=signal.SIGTERM if first == signal.SIGHUP else first)
        except KeyboardInterrupt:
            stop([proc], signum=signal.SIGKILL, grace_s=0)
        return _exit_status(proc.returncode)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
