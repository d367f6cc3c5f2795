"""``kvflow cluster`` and a worker lost mid-run, with real ``kvflow serve`` subprocesses behind smg."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from itertools import pairwise

import httpx
import pytest

from kvflow_orch import END, START, Workflow, WorkflowError, arun
from kvflow_orch.harness.cluster import free_port, start_cluster
from kvflow_orch.clients import GatewayClient, GatewayConfig
from scaleout_helpers import require_smg, wait_for

KVFLOW = [sys.executable, "-m", "kvflow_orch.cli"]
FLAGS = ["--device-tokens", "4096", "--host-tokens", "0"]


def _pipeline(calls: int) -> Workflow:
    """``calls`` agents in a row with a function node in the middle (a steps update mid-run)."""
    wf = Workflow("pipeline")
    names = [f"agent{i}" for i in range(calls)]
    for name in names:
        wf.add_agent(name, f"You are {name}. " * 30, "Go: {task}", output="task", max_tokens=2)
    wf.add_node("tool", lambda state: {"task": state["task"][:20]})
    chain = [START, *names[: calls // 2], "tool", *names[calls // 2:], END]
    for a, b in pairwise(chain):
        wf.add_edge(a, b)
    return wf


@pytest.mark.parametrize("argv, message", [
    (["--workers", "0", "--model", "tiny-random"], "--workers: must be a positive integer"),
    (["--workers", "2", "--model", "tiny-random", "--port", "5"], "--port is set by kvflow cluster"),
    (["--workers", "2", "--model", "tiny-random", "--policy", "nope"], "argument --policy: invalid choice: 'nope'"),
    (["--workers", "2", "--model", "tiny-random", "--device-tokens", "-1"], "--device-tokens"),
    (["--workers", "2", "--model", "tiny-random", "--bogus"], "unrecognized arguments: --bogus"),
    (["--workers", "2", "--model", "tiny-random", "--restart-delay", "-1"],
     "argument --restart-delay: must be a number of seconds >= 0, got -1"),
    (["--workers", "2", "--model", "tiny-random", "--restart-max-delay", "nan"], "argument --restart-max-delay"),
    (["--workers", "2", "--model", "tiny-random", "--restart-delay", "5", "--restart-max-delay", "1"],
     "--restart-delay (5 s) exceeds --restart-max-delay (1 s)"),
])
def test_bad_flags_are_refused_before_anything_starts(argv: list[str], message: str) -> None:
    done = subprocess.run([*KVFLOW, "cluster", *argv], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr, done.stderr


def test_cluster_prints_the_urls_serves_through_the_gateway_learns_on_the_workers_and_stops_cleanly() -> None:
    require_smg()
    port = free_port()
    proc = subprocess.Popen([*KVFLOW, "cluster", "--workers", "2", "--model", "tiny-random", "--gateway-port",
                             str(port), *FLAGS, "--policy", "lru", "--learned-hints"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = [proc.stdout.readline().strip() for _ in range(3)]  # type: ignore[union-attr]
        assert lines[0].startswith("worker 0: http://127.0.0.1:") and lines[1].startswith("worker 1: http://127.0.0.1:")
        assert lines[2] == f"gateway: http://127.0.0.1:{port}"
        workers = [line.split(": ", 1)[1] for line in lines[:2]]
        # serve flags reached both
        assert {httpx.get(w + "/kvflow/v1/info").json()["policy"] for w in workers} == {"lru"}
        chat = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "tiny-random", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code == 200 and chat.headers["x-smg-routed-worker-id"] in workers
        served = {w: [] for w in workers}  # the sessions each worker served
        served[chat.headers["x-smg-routed-worker-id"]].append("hi")
        _plain_sessions(f"http://127.0.0.1:{port}", served)
        # each worker learned the requests it served, and linked each session's turns into one
        learner = {w: httpx.get(w + "/kvflow/v1/stats").json()["learner"] for w in workers}
        for w in workers:
            assert learner[w]["enabled"] and learner[w]["declared_hint_requests"] == 0
            assert learner[w]["learned_hint_requests"] == len(served[w]), (w, learner[w], served)
            assert learner[w]["live_sessions"] == len(set(served[w])), (w, learner[w], served)
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    for url in workers:
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=2)


def _plain_sessions(gateway: str, served: dict[str, list[str]], turns: int = 3) -> None:
    """Two conversations as a framework sends them (no hint, no session key), each kept on one
    worker by smg's routing key; ``served`` gets the session of every request a worker served."""
    chats = {name: [{"role": "system", "content": f"You are the {name}. " + "Answer briefly. " * 20},
                    {"role": "user", "content": f"First task for the {name}."}] for name in ("planner", "critic")}
    with httpx.Client(timeout=60) as client:
        for turn in range(turns):
            for name, messages in chats.items():
                r = client.post(gateway + "/v1/chat/completions", headers={"x-smg-routing-key": name}, json={
                    "model": "tiny-random", "max_tokens": 2, "temperature": 0, "messages": messages})
                assert r.status_code == 200, r.text
                served[r.headers["x-smg-routed-worker-id"]].append(name)
                messages += [{"role": "assistant", "content": r.json()["choices"][0]["message"]["content"]},
                             {"role": "user", "content": f"Turn {turn + 2}: go on."}]


def test_a_worker_lost_mid_run_loses_no_workflow_and_survivors_drain() -> None:
    require_smg()
    with start_cluster(2, "tiny-random", FLAGS) as cluster:
        client = GatewayClient(cluster.gateway, cluster.workers, GatewayConfig(routing="workflow"))
        calls = 0
        original = client.chat

        async def counted(*args, **kwargs):
            nonlocal calls
            reply = await original(*args, **kwargs)
            calls += 1
            if calls == 8:
                cluster.processes[0].kill()  # SIGKILL: no goodbye, requests in flight are cut
            return reply

        client.chat = counted  # type: ignore[method-assign]

        async def go() -> list:
            results = await asyncio.gather(*(arun(_pipeline(6), {"task": f"t{i}"}, backend=client,
                                                  workflow_id=f"wf{i}", namespace="loss") for i in range(8)))
            await client.aclose()
            return results

        results = asyncio.run(go())
        assert cluster.processes[0].poll() is not None and len(results) == 8
        assert calls == 8 * 6
        survivor = cluster.workers[1]
        # Every workflow ended with done at the survivor: its hint table holds none of them.
        wait_for(lambda: httpx.get(survivor + "/kvflow/v1/stats").json()["workflows"] == 0, 10, "the table to drain")


def test_when_no_worker_is_left_the_error_names_the_node_and_the_url() -> None:
    require_smg()
    with start_cluster(1, "tiny-random", FLAGS) as cluster:
        cluster.processes[0].kill()
        cluster.processes[0].wait()
        client = GatewayClient(cluster.gateway, cluster.workers, GatewayConfig(retries=1, backoff_s=0.1))
        started = time.monotonic()
        with pytest.raises(WorkflowError) as err:
            asyncio.run(arun(_pipeline(2), {"task": "x"}, backend=client, workflow_id="lost"))
        assert "node 'agent0'" in str(err.value) and cluster.gateway in str(err.value)
        assert time.monotonic() - started < 60


def test_a_worker_whose_port_another_process_took_starts_on_a_new_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """free_port() names a port that was free; another process may bind it first (pytest-xdist's
    other worker did, in CI). The cluster then starts that worker on a new port."""
    require_smg()
    import socket

    from kvflow_orch.harness import cluster as cluster_module

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        held = taken.getsockname()[1]
        ports = iter([held])
        monkeypatch.setattr(cluster_module, "free_port", lambda: next(ports, None) or free_port())
        with start_cluster(1, "tiny-random", FLAGS) as cluster:
            assert f":{held}" not in cluster.workers[0]
            assert httpx.get(cluster.workers[0] + "/health", timeout=5).status_code == 200
            assert len(cluster.processes) == 2  # the worker that came up and the gateway: none left behind
