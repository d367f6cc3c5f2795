"""Data movement between the device and host KV pools, exactly as the cache brain's results ask.

The brain decides (which slots, which nodes); this module copies and reports back. Demotions are
copied at once, before any device slot they free can be written again; load tasks either run now
(admission: the stall) or on the prefetch worker (overlapping the forward pass).
"""

from __future__ import annotations

from typing import Callable

from backends.kvcache import EvictResult, KVCache, LoadTask, OffloadTask
from backends.local.pools import KVPool, copy_slots
from backends.local.prefetch_worker import PrefetchWorker

__all__ = ["TierMover"]


class TierMover:
    def __init__(self, cache: KVCache, device_pool: KVPool, host_pool: KVPool, *, prefetch: bool,
                 wake: Callable[[], None], load_copy: Callable[[LoadTask], None] | None = None) -> None:
        """``load_copy(task)`` replaces the worker's host->device copy (a seam for fault injection)."""
        self.cache = cache
        self.device_pool = device_pool
        self.host_pool = host_pool
        copy = load_copy or self._copy_in
        self.worker = PrefetchWorker(copy, device_pool.device, wake) if prefetch and host_pool.tokens else None
        self.prefetch_tasks = 0
        # tokens copied each way (loop thread only; prefetch copies are counted when reported done)
        self.h2d_tokens = 0
        self.d2h_tokens = 0

    def demote(self, evicted: EvictResult) -> None:
        # write-back: copy device rows to host before anything reuses those device slots
        for demotion in evicted.demoted:
            copy_slots(self.device_pool, demotion.device_slots, self.host_pool, demotion.host_slots)
            self.d2h_tokens += len(demotion.device_slots)

    def load_now(self, task: LoadTask) -> None:
        try:
            self._copy_in(task, non_blocking=False)
        except BaseException:
            self.demote(self.cache.fail_load(task))  # back to host-only: never left loading
            raise
        self.h2d_tokens += len(task.device_slots)
        self.cache.complete_load(task)

    def offload_now(self, task: OffloadTask) -> None:
        copy_slots(self.device_pool, task.device_slots, self.host_pool, task.host_slots)
        self.d2h_tokens += len(task.device_slots)
        self.cache.complete_offload(task)

    def plan_prefetch(self) -> None:
        """Ask the brain for load tasks (after a hint or steps update) and hand them to the worker."""
        if self.worker is None:
            return
        plan = self.cache.plan_prefetch()
        self.demote(plan.evicted)
        for task in plan.tasks:
            self.prefetch_tasks += 1
            self.worker.submit(task)

    def finish_prefetches(self) -> bool:
        """Report the worker's finished copies to the brain (loop thread only); whether there were any."""
        if self.worker is None:
            return False
        finished = self.worker.drain()
        for done in finished:
            if done.error is None:
                self.h2d_tokens += len(done.task.device_slots)
                self.cache.complete_load(done.task)
            else:
                self.demote(self.cache.fail_load(done.task))
        return bool(finished)

    def stop(self) -> None:
        if self.worker is not None:
            self.worker.stop()
            self.finish_prefetches()

    def _copy_in(self, task: LoadTask, non_blocking: bool = True) -> None:
        # the worker synchronises its side stream before reporting the task done
        copy_slots(self.host_pool, task.host_slots, self.device_pool, task.device_slots, non_blocking=non_blocking)
