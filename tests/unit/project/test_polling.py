"""The suite's poll helper (tests/polling.py): it returns the first truthy value, and a timeout
fails the test with what was awaited, the last value and the caller's detail."""

from __future__ import annotations

import itertools

import pytest

from tests.polling import wait_until


def test_returns_the_first_truthy_value():
    calls = itertools.count()
    assert wait_until(lambda: next(calls) >= 2 and "ready", "the third call", 5, interval=0) == "ready"


def test_a_timeout_fails_with_what_was_awaited_the_last_value_and_the_detail():
    with pytest.raises(pytest.fail.Exception) as failed:
        wait_until(lambda: 0, "the counter to move", 0.05, interval=0.01, detail=lambda: "log tail")
    assert str(failed.value) == "not within 0.05 s: the counter to move (last: 0)\nlog tail"


def test_an_exception_of_the_predicate_is_not_swallowed():
    def dead():
        raise ProcessLookupError("the server died")

    with pytest.raises(ProcessLookupError):
        wait_until(dead, "never", 5)
