"""backends.process_group on real process trees (tests/launch/engine_like.py): whatever the engine
does on a signal, nothing of it outlives the process that started it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from process_tree import assert_stops, left_after, requires_proc, tree

from backends.process_group import STOP_GRACE_S, start, stop

pytestmark = requires_proc
ROOT = Path(__file__).resolve().parents[2]
ENGINE = [sys.executable, str(Path(__file__).with_name("engine_like.py"))]
# a supervisor as kvflow serve is one: run_foreground in the main thread of its own process
SUPERVISOR = [sys.executable, "-c", "import sys; from backends.process_group import run_foreground; "
              "raise SystemExit(run_foreground(sys.argv[1:]))"]


def _pids(path: Path, timeout_s: float = 60.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the engine-like tree did not start"
        time.sleep(0.05)
    return json.loads(path.read_text())


def _supervised(tmp_path: Path, mode: str = "serve") -> tuple[subprocess.Popen, set[int]]:
    pids_file = tmp_path / "pids.json"
    proc = subprocess.Popen([*SUPERVISOR, *ENGINE, str(pids_file), mode], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    started = _pids(pids_file)
    return proc, tree(proc.pid) | {started["leader"], *started["helpers"]}


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 128 + signal.SIGTERM),
                                            (signal.SIGINT, 128 + signal.SIGINT),
                                            (signal.SIGHUP, 128 + signal.SIGTERM)])
def test_a_stop_signal_stops_the_whole_tree_even_helpers_that_ignore_it(tmp_path: Path, signum: int,
                                                                        status: int) -> None:
    proc, pids = _supervised(tmp_path)
    assert len(pids) == 4  # supervisor, engine, its two helpers
    # the engine dies of the signal (SIGINT: Python re-raises it after KeyboardInterrupt) and the supervisor says so
    assert assert_stops(proc, signum, pids, ports=()) == status


def test_an_engine_that_exits_by_itself_takes_its_helpers_along(tmp_path: Path) -> None:
    proc, pids = _supervised(tmp_path, "crash")
    assert proc.wait(STOP_GRACE_S + 5) == 3
    assert not left_after(pids, 1)


def test_a_second_signal_kills_at_once(tmp_path: Path) -> None:
    proc, pids = _supervised(tmp_path, "deaf")
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert left_after(pids, 0.5), "the deaf engine should still be running within its grace period"
    second = time.monotonic()
    assert assert_stops(proc, signal.SIGINT, pids, ports=(), within_s=STOP_GRACE_S - 1) == 128 + signal.SIGKILL
    assert time.monotonic() - second < STOP_GRACE_S - 1


def test_a_killed_supervisor_still_takes_the_engine_down(tmp_path: Path) -> None:
    """SIGKILL cannot be caught: the engine is told by the kernel (its parent-death signal)."""
    proc, pids = _supervised(tmp_path)
    proc.kill()
    proc.wait()
    engine = [pid for pid in pids if pid != proc.pid]
    leader = json.loads((tmp_path / "pids.json").read_text())["leader"]
    assert not left_after([leader], 10), "the engine outlived its SIGKILLed supervisor"
    for pid in engine:  # its helpers ignore SIGTERM: only a supervisor could end them; clean up
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_stop_waits_one_grace_period_for_all_sessions_together(tmp_path: Path) -> None:
    procs, pids = [], set()
    for i in range(3):
        path = tmp_path / f"pids{i}.json"
        procs.append(start([*ENGINE, str(path), "deaf"]))
        started = _pids(path)
        pids |= {started["leader"], *started["helpers"]}
    began = time.monotonic()
    stop(procs, grace_s=1.0)
    assert time.monotonic() - began < 3.0  # one grace period, not three
    assert not left_after(pids, 0)
    assert [proc.returncode for proc in procs] == [-signal.SIGKILL] * 3


def test_a_burst_of_signals_still_leaves_nothing_behind(tmp_path: Path) -> None:
    """Process managers and wrappers signal more than once (pkill reaching both `timeout` and the
    supervisor, which `timeout` then signals again; systemd signalling the whole cgroup): a third
    signal landing in the final SIGKILL pass once cut it short and left vLLM's EngineCore running."""
    proc, pids = _supervised(tmp_path, "deaf")
    deadline = time.monotonic() + 2.0
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        time.sleep(0.0005)
    proc.wait(STOP_GRACE_S)  # its status depends on where the burst ends: after its handlers are gone, SIGTERM
    assert not left_after(pids, 2.0)
