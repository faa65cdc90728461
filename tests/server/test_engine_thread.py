"""The engine thread builds the engine and then steps it: one thread does all of its torch work."""

from __future__ import annotations

import threading

import pytest

from engine.server.engine_thread import EngineThread


def test_calls_and_the_loop_run_on_the_same_thread() -> None:
    worker = EngineThread()
    built_on = worker.call(threading.get_ident)
    stepped_on: list[int] = []
    thread = worker.run_loop(lambda: stepped_on.append(threading.get_ident()))
    thread.join(timeout=10)
    assert not thread.is_alive(), "the thread ends after its loop returns"
    assert built_on != threading.get_ident()
    assert stepped_on == [built_on]
    with pytest.raises(RuntimeError, match="already ended"):
        worker.call(threading.get_ident)


def test_an_exception_in_a_call_is_raised_to_the_caller_and_the_thread_goes_on() -> None:
    worker = EngineThread()

    def bad_model() -> None:
        raise ValueError("unknown model 'x'")

    with pytest.raises(ValueError, match="unknown model"):
        worker.call(bad_model)
    assert worker.call(lambda: 3) == 3
    worker.run_loop(lambda: None).join(timeout=10)
