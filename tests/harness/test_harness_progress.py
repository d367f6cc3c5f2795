"""The demo's live progress line: rewritten in place on a terminal, throttled lines in a log, and
the share of prompt tokens served from cache summed over the calls done."""

from __future__ import annotations

import io

from kvflow_orch.harness.progress import CallProgress
from kvflow_orch.protocol import NodeRecord
from kvflow_orch.runtime import NodeEvent


def _call(progress: CallProgress, agent: str, prompt: int, cached: int) -> None:
    progress(NodeEvent("start", "wf", agent, agent, None))
    progress(NodeEvent("finish", "wf", agent, agent, NodeRecord(agent, agent, 0.0, 1.0, prompt, 4, cached, 1)))


def test_a_terminal_line_is_rewritten_in_place_and_ended_on_close():
    stream = io.StringIO()
    progress = CallProgress("kvflow (kvflow)", 2, stream, live=True)
    _call(progress, "architect", 1000, 0)
    _call(progress, "qa", 1000, 500)
    progress.close()
    text = stream.getvalue()
    assert "\n" not in text[:-1] and text.endswith("\n")  # one line, rewritten with \r
    frames = text.split("\r")[1:]
    assert "(now: architect)" in frames[0] and "0/2 calls" in frames[0]
    assert frames[-1].rstrip().endswith("25% of prompt tokens from cache")
    assert "[####################] 2/2 calls" in frames[-1]


def test_a_log_gets_a_line_per_interval_and_the_last_call_always():
    stream = io.StringIO()
    progress = CallProgress("baseline (lru)", 3, stream, live=False, every_s=3600.0)
    for agent in ("product_manager", "architect", "qa"):
        _call(progress, agent, 100, 0)
    progress.close()
    lines = stream.getvalue().splitlines()
    # the interval has not passed since the first event: only the last call's line (and no repeat on close)
    assert len(lines) == 1 and "3/3 calls" in lines[0] and "0% of prompt tokens from cache" in lines[0]
    assert "now:" not in lines[0]


def test_an_unknown_total_counts_calls_without_a_bar():
    stream = io.StringIO()
    progress = CallProgress("run", None, stream, live=False, every_s=0.0)
    _call(progress, "writer", 10, 10)
    progress.close()
    assert stream.getvalue().splitlines()[0].split()[1:3] == ["1", "calls"]
