"""Background executor of the brain's load tasks (host -> device copies).

The worker thread only moves bytes; it never touches the brain, which is single-threaded: finished
tasks are handed back through :meth:`PrefetchWorker.drain` and the engine thread calls
``complete_load``/``fail_load``. On CUDA the copies run on a side stream so they overlap the
forward pass; on CPU torch releases the GIL inside the copy kernels, so they overlap too.
Setting ``copies`` to a list records each task's copy as a ``(start, end)`` ``time.perf_counter``
interval; on CUDA its length is the side stream's own CUDA-event time, ending when the stream's
synchronisation returned.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Callable, NamedTuple

import torch

__all__ = ["PrefetchWorker", "FinishedLoad"]

log = logging.getLogger("kvflow.engine")


class FinishedLoad(NamedTuple):
    task: Any
    error: BaseException | None


class PrefetchWorker:
    def __init__(self, copy: Callable[[Any], None], device: torch.device, on_finish: Callable[[], None]) -> None:
        """``copy(task)`` performs one task's copy; ``on_finish`` wakes the engine loop."""
        self._copy = copy
        self._tasks: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[FinishedLoad] = queue.SimpleQueue()
        self._on_finish = on_finish
        self._stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._thread = threading.Thread(target=self._run, name="kvflow-prefetch", daemon=True)
        self._stopped = False
        self.copies: list[tuple[float, float]] | None = None
        self._thread.start()

    def submit(self, task: Any) -> None:
        self._tasks.put(task)

    def drain(self) -> list[FinishedLoad]:
        out = []
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                break
        return out

    def stop(self) -> None:
        self._stopped = True
        self._tasks.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            task = self._tasks.get()
            if task is None or self._stopped:
                return
            error: BaseException | None = None
            try:
                start = time.perf_counter()
                if self._stream is not None:
                    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    with torch.cuda.stream(self._stream):
                        begin.record(self._stream)
                        self._copy(task)
                        end.record(self._stream)
                    self._stream.synchronize()
                    done = time.perf_counter()
                    start = max(start, done - begin.elapsed_time(end) / 1e3)
                else:
                    self._copy(task)
                    done = time.perf_counter()
                if self.copies is not None:
                    self.copies.append((start, done))
            except BaseException as exc:  # reported to the engine thread, which fails the load
                log.exception("prefetch copy failed")
                error = exc
            self._done.put(FinishedLoad(task, error))
            self._on_finish()
