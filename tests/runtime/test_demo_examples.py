"""``kvflow demo`` and the examples run end to end on the embedded engine (tiny-random, so the test
takes seconds): progress per node, the per-agent table with the steps each hint carried, cache
counters, and the examples' own checks. Run in-process (the CLI's main and the scripts as
__main__) to avoid paying torch's import once per script."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path


from kvflow_orch.cli import main as kvflow

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _script(monkeypatch, name: str, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", [name, *argv])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")


def test_demo_on_tiny_random(capsys):
    code = kvflow(["demo", "--model", "tiny-random", "--device-tokens", "16384", "--max-tokens", "4",
                   "--fix-rounds", "1", "--plain"])
    out = capsys.readouterr().out
    assert code == 0
    for node in ("product_manager", "architect", "project_manager", "engineer", "qa"):
        assert f"> {node} started" in out and f"+ {node} done" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.split()}
    # 7 calls (pm, architect, pm2, engineer, qa, engineer, qa); the steps qa saw in each hint:
    # 4 3 2 1 0 while the pipeline runs, then 1 (engineer fixing) and 0 (reviewing again)
    assert rows["qa"][1:9] == ["2", "4", "3", "2", "1", "0", "1", "0"]
    assert rows["product_manager"][1:4] == ["1", "0", "-"]
    assert rows["total"][1] == "7"
    assert "device_hit_tokens" in out and "7 LLM calls" in out


def test_demo_rejects_bad_pool(capsys):
    assert kvflow(["demo", "--model", "tiny-random", "--device-tokens", "0"]) == 2
    assert "device_tokens must be > 0" in capsys.readouterr().err


def test_quickstart_and_concurrent_examples(monkeypatch, capsys):
    _script(monkeypatch, "quickstart.py", "local:tiny-random")
    out = capsys.readouterr().out
    assert "final draft:" in out and out.count("writer") == 2
    _script(monkeypatch, "concurrent.py", "local:tiny-random", "3")
    out = capsys.readouterr().out
    assert "3 workflows in" in out and out.count("4 calls") == 3


def test_replay_example_outputs_match_across_policies(monkeypatch, capsys):
    _script(monkeypatch, "metagpt_replay.py", "--model", "tiny-random", "--workflow", "peer", "--max-tokens", "4",
            "--rounds", "1")
    out = capsys.readouterr().out
    assert "greedy outputs identical under both policies: yes" in out
    assert "workflow time (s)" in out and "device_hit_tokens" in out
