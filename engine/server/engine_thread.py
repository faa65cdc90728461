"""The one thread that does all of an engine's torch work: it builds the engine, then runs its loop.

NOTE: each thread that enters an OpenMP parallel region gets its own OpenMP worker pool. Once a
second pool exists (the model loaded on the main thread, stepped on another), libgomp counts more
managed threads than cores and its workers stop spinning between regions: every one of the few
hundred parallel regions of a decode step then waits for a futex wake-up. Building and stepping
the engine on the same thread keeps one pool.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class EngineThread:
    """Runs jobs one after another on one daemon thread; :meth:`run_loop` hands it its last job."""

    def __init__(self, name: str = "servescope-engine") -> None:
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name=name, daemon=True)
        self.thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            job()

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(*args)`` on the thread and return its result (or raise its exception) here."""
        if not self.thread.is_alive():
            raise RuntimeError("the engine thread has already ended")
        done = threading.Event()
        result: list[T] = []
        error: list[BaseException] = []

        def job() -> None:
            try:
                result.append(fn(*args))
            except BaseException as exc:  # handed back to the caller, who re-raises it
                error.append(exc)
            finally:
                done.set()

        self._jobs.put(job)
        done.wait()
        if error:
            raise error[0]
        return result[0]

    def run_loop(self, loop: Callable[[], None]) -> threading.Thread:
        """Run ``loop`` as the thread's last job; the thread ends when it returns."""
        self._jobs.put(loop)
        self._jobs.put(None)
        return self.thread
