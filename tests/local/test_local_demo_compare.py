"""``kvflow demo`` runs the workflow twice on the same engine configuration, baseline (lru, no
prefetch) and kvflow, and shows them side by side; ``examples/metagpt_replay.py`` reports times only
as medians of repeats. On SmolLM2 (slow) the default demo pool is small enough that the difference
shows: the baseline reloads evicted prefixes at admission, kvflow has them prefetched."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import pytest

from kvflow_orch.cli import main as kvflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def side_by_side(out: str) -> dict[str, list[str]]:
    table = out.split("side by side", 1)[1].splitlines()[2:]
    rows = {}
    for line in table:
        if not line.strip() or line.startswith("greedy"):
            break
        label, *values = line.rsplit(None, 2)
        rows[label.strip()] = values
    return rows


def test_demo_shows_baseline_and_kvflow_side_by_side(capsys):
    code = kvflow(["demo", "--model", "tiny-random", "--device-tokens", "16384", "--max-tokens", "4",
                   "--fix-rounds", "1", "--plain"])
    out = capsys.readouterr().out
    assert code == 0
    assert "baseline run: policy lru, no prefetch" in out and "kvflow run: policy kvflow, prefetch" in out
    assert "baseline (lru, no prefetch)" in out and "kvflow (kvflow, prefetch)" in out
    rows = side_by_side(out)
    for key in ("prompt tokens", "recomputed_tokens", "device_hit_tokens", "host_hit_tokens", "prefetch_hit_tokens",
                "wall time (s)"):
        assert len(rows[key]) == 2, key
    assert rows["prompt tokens"][0] == rows["prompt tokens"][1]
    assert "greedy outputs identical in both runs: yes" in out


def test_demo_without_baseline_runs_once(capsys):
    assert kvflow(["demo", "--model", "tiny-random", "--device-tokens", "16384", "--max-tokens", "2",
                   "--fix-rounds", "0", "--plain", "--no-baseline"]) == 0
    out = capsys.readouterr().out
    assert "baseline run" not in out and "kvflow run" in out and "greedy outputs identical" not in out


def test_replay_example_reports_median_times_of_repeats(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["metagpt_replay.py", "--model", "tiny-random", "--workflow", "peer",
                                      "--max-tokens", "2", "--rounds", "0", "--repeats", "2"])
    runpy.run_path(str(EXAMPLES / "metagpt_replay.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("running peer under lru") == 2 and out.count("running peer under kvflow") == 2
    (times,) = [line for line in out.splitlines() if line.startswith("workflow time (s), median [min-max]")]
    assert times.count("[") == 3 and "(repeats differ)" not in out  # counters agree across repeats


@pytest.mark.slow
def test_smollm2_demo_default_pool_shows_prefetch_replacing_admission_loads(capsys):
    assert kvflow(["demo", "--plain"]) == 0
    rows = side_by_side(capsys.readouterr().out)
    base_host, kv_host = map(int, rows["host_hit_tokens"])
    base_prefetch, kv_prefetch = map(int, rows["prefetch_hit_tokens"])
    assert base_prefetch == 0 and kv_prefetch > 0
    assert kv_host < base_host
    assert int(rows["recomputed_tokens"][1]) <= int(rows["recomputed_tokens"][0])
