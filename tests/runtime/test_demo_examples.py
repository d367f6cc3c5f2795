"""The examples run end to end on the embedded engine (tiny-random, so the test takes seconds) with
their own checks (``kvflow demo``: tests/cli/test_demo.py). Run in-process (the scripts as
__main__) to avoid paying torch's import once per script."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _script(monkeypatch, name: str, *argv: str) -> None:
    monkeypatch.setattr(sys, "argv", [name, *argv])
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")


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
