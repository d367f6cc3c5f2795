"""`kvflow graph --stats`: learned probabilities and expected steps next to the static ones."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

from kvflow_orch import BranchStats
from kvflow_orch.cli import main as kvflow_main


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = kvflow_main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_graph_prints_learned_probabilities_and_expected_steps(tmp_path):
    stats = BranchStats()
    for target, n in (("worker_0", 30), ("worker_1", 10), ("__end__", 2)):
        for _ in range(n):
            stats.observe("supervisor", "supervisor", target)
    path = tmp_path / "stats.json"
    stats.save(path)
    rc, out, err = _run(["graph", "workflows.supervisor:workflow", "--stats", str(path)])
    assert rc == 0, err
    assert "supervisor (42 decisions): worker_0=0.608, worker_1=0.216," in out  # (n + 1) / (42 + 9)
    lines = dict(line.split(None, 1) for line in out.split("static -> expected\n")[1].splitlines())
    assert lines["supervisor"] == "0 -> 0"
    assert lines["worker_0"].startswith("1 -> ") and lines["worker_7"].startswith("1 -> ")
    expected = {w: float(lines[w].split("-> ")[1]) for w in ("worker_0", "worker_1", "worker_7")}
    assert 1 < expected["worker_0"] < expected["worker_1"] < expected["worker_7"]


def test_graph_without_stats_is_unchanged_and_bad_stats_are_clear(tmp_path):
    rc, out, _ = _run(["graph", "workflows.supervisor:workflow"])
    assert rc == 0 and "learned routing" not in out
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    rc, _, err = _run(["graph", "workflows.supervisor:workflow", "--stats", str(bad)])
    assert rc == 2 and "unsupported format version" in err
    rc, _, err = _run(["graph", "workflows.supervisor:workflow", "--stats", str(tmp_path / "none.json")])
    assert rc == 2 and "cannot read --stats" in err
    rc, _, err = _run(["graph", "workflows.supervisor:workflow", "--mermaid", "--stats", str(bad)])
    assert rc == 2 and "--mermaid" in err
