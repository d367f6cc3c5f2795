"""``examples/metagpt_replay.py`` runs a workflow under each policy on the embedded engine and
reports times only as medians of repeats (``kvflow demo`` itself: tests/cli/test_demo.py)."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_replay_example_reports_median_times_of_repeats(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["metagpt_replay.py", "--model", "tiny-random", "--workflow", "peer",
                                      "--max-tokens", "2", "--rounds", "0", "--repeats", "2"])
    runpy.run_path(str(EXAMPLES / "metagpt_replay.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("running peer under lru") == 2 and out.count("running peer under kvflow") == 2
    (times,) = [line for line in out.splitlines() if line.startswith("workflow time (s), median [min-max]")]
    assert times.count("[") == 3 and "(repeats differ)" not in out  # counters agree across repeats
