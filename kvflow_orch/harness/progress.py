"""A live progress line for a run of LLM calls: ``kvflow demo`` shows one per run.

On a terminal the line is rewritten in place as calls start and finish; elsewhere (logs, pipes,
tests) a line is printed when a call finishes, at most one every ``every_s`` seconds, and always
for the last call, so a log shows the run advancing without one line per token.
"""

from __future__ import annotations

import sys
import time
from typing import IO

from ..runtime import NodeEvent

__all__ = ["CallProgress"]


class CallProgress:
    """``on_event`` callback: ``label [#####.....] done/total calls  elapsed  N% of prompt tokens
    from cache  (now: agent)``. ``total`` is the number of LLM calls the run will make (``None``:
    unknown). The share is the backends' ``cached_tokens`` over ``prompt_tokens`` of the calls done."""

    WIDTH = 20

    def __init__(self, label: str, total: int | None, stream: IO[str] | None = None, *,
                 live: bool | None = None, every_s: float = 5.0) -> None:
        self.label = label
        self.total = total
        self.stream = stream or sys.stderr
        self.live = bool(getattr(self.stream, "isatty", lambda: False)()) if live is None else live
        self.every_s = every_s
        self.calls = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.running: str | None = None
        self._t0: float | None = None  # the first event starts the clock (the engine is up by then)
        self._printed_at = 0.0
        self._width = 0
        self._printed_calls = 0

    def __call__(self, event: NodeEvent) -> None:
        if self._t0 is None:
            self._t0 = self._printed_at = time.perf_counter()
        if event.kind == "start":
            if event.agent:
                self.running = event.agent
                self._show(final=False)
            return
        record = event.record
        if record is None or not record.llm_calls:
            return
        self.calls += record.llm_calls
        self.prompt_tokens += record.prompt_tokens
        self.cached_tokens += record.cached_tokens
        self.running = None
        self._show(final=False)

    def close(self) -> None:
        """End the line (a terminal's cursor moves to the next line); prints the final state."""
        self._show(final=True)

    def line(self) -> str:
        elapsed = time.perf_counter() - self._t0 if self._t0 is not None else 0.0
        if self.total:
            filled = min(self.WIDTH, self.WIDTH * self.calls // self.total)
            bar = f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.calls}/{self.total} calls"
        else:
            bar = f"{self.calls} calls"
        now = f"  (now: {self.running})" if self.running else ""
        cached = f"{self.cached_tokens / self.prompt_tokens:4.0%}" if self.prompt_tokens else "   -"
        return f"{self.label:<18} {bar}  {elapsed:6.1f} s  {cached} of prompt tokens from cache{now}"

    def _show(self, final: bool) -> None:
        text = self.line()
        if self.live:
            pad = max(0, self._width - len(text))
            self._width = len(text)
            self.stream.write("\r" + text + " " * pad + ("\n" if final else ""))
            self.stream.flush()
            return
        if self.running is not None or self.calls == self._printed_calls:
            return  # a log line per finished call at most, and none twice for the same count
        now = time.perf_counter()
        done = self.total is not None and self.calls >= self.total
        if final or done or now - self._printed_at >= self.every_s:
            print(text, file=self.stream, flush=True)
            self._printed_at, self._printed_calls = now, self.calls
