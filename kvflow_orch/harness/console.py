"""What ``kvflow run``/``kvflow demo`` and the examples print: live per-node progress and tables.

Output goes through rich when the stream is a terminal, and as plain aligned text otherwise (logs,
pipes, CI), so the figures stay greppable.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any, NamedTuple, Sequence

from ..runtime import NodeEvent, RunResult

__all__ = ["ProgressPrinter", "AgentSummary", "summarize_agents", "print_table", "agent_rows", "AGENT_COLUMNS"]


def _is_tty(stream: IO[str]) -> bool:
    return bool(getattr(stream, "isatty", lambda: False)())


class ProgressPrinter:
    """``on_event`` callback printing one line when a node starts and one when it finishes."""

    def __init__(self, stream: IO[str] | None = None, *, fancy: bool | None = None) -> None:
        self.stream = stream or sys.stderr
        self.fancy = _is_tty(self.stream) if fancy is None else fancy
        self.t0 = time.perf_counter()
        self._console = None
        if self.fancy:
            from rich.console import Console

            self._console = Console(file=self.stream, highlight=False)

    def __call__(self, event: NodeEvent) -> None:
        at = time.perf_counter() - self.t0
        who = event.node if event.agent in (None, event.node) else f"{event.node} ({event.agent})"
        if event.kind == "start":
            kind = "agent" if event.agent else "step"
            line, style = f"[{at:7.2f}s] > {who} started ({kind})", "cyan"
        else:
            r = event.record
            took = (r.end - r.start) if r else 0.0
            detail = (f" prompt {r.prompt_tokens} tok, cached {r.cached_tokens}, out {r.completion_tokens}"
                      if r and r.llm_calls else "")
            line, style = f"[{at:7.2f}s] + {who} done in {took:.2f}s{detail}", "green"
        if self._console is not None:
            self._console.print(line, style=style)
        else:
            print(line, file=self.stream, flush=True)


class AgentSummary(NamedTuple):
    agent: str
    calls: int
    steps_sent: tuple[int | None, ...]
    """The agent's own steps-to-execution in every hint of the run, in call order."""
    prompt_tokens: int
    cached_tokens: int
    recomputed_tokens: int
    seconds: float


def summarize_agents(result: RunResult) -> list[AgentSummary]:
    """One summary per agent that made calls, in order of its first call."""
    calls: dict[str, list[Any]] = {}
    for call in result.calls:
        calls.setdefault(call.agent, []).append(call)
    sent: dict[str, list[int | None]] = {name: [] for name in calls}
    for call in (c for c in result.calls if c.hint is not None):
        for name, value in call.hint["steps"].items():
            if name in sent:
                sent[name].append(value)
    summaries = []
    for name, own in calls.items():
        prompt = sum(c.prompt_tokens for c in own)
        cached = sum(c.cached_tokens for c in own)
        seconds = sum(c.duration_s for c in own)
        summaries.append(AgentSummary(name, len(own), tuple(sent[name]), prompt, cached, prompt - cached, seconds))
    return summaries


AGENT_COLUMNS = ("agent", "calls", "steps sent", "prompt tok", "cached", "recomputed", "time s")


def _steps_text(values: Sequence[int | None]) -> str:
    text = " ".join("-" if v is None else str(v) for v in values)
    return text if len(text) <= 40 else text[:37] + "..."


def agent_rows(summaries: Sequence[AgentSummary]) -> list[list[str]]:
    rows = [
        [s.agent, str(s.calls), _steps_text(s.steps_sent), str(s.prompt_tokens), str(s.cached_tokens),
         str(s.recomputed_tokens), f"{s.seconds:.2f}"]
        for s in summaries
    ]
    total = [
        "total",
        str(sum(s.calls for s in summaries)),
        "",
        str(sum(s.prompt_tokens for s in summaries)),
        str(sum(s.cached_tokens for s in summaries)),
        str(sum(s.recomputed_tokens for s in summaries)),
        f"{sum(s.seconds for s in summaries):.2f}",
    ]
    return rows + [total]


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], stream: IO[str] | None = None, *,
                fancy: bool | None = None) -> None:
    stream = stream or sys.stdout
    if _is_tty(stream) if fancy is None else fancy:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for i, col in enumerate(columns):
            table.add_column(col, justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*row)
        Console(file=stream).print(table)
        return
    widths = [max([len(str(c)), *(len(str(r[i])) for r in rows)]) for i, c in enumerate(columns)]
    print(title, file=stream)
    for row in (list(columns), *rows):
        cells = [str(v).ljust(w) if i == 0 else str(v).rjust(w)
                 for i, (v, w) in enumerate(zip(row, widths, strict=True))]
        print("  ".join(cells).rstrip(), file=stream)
    stream.flush()
