"""Stopping a fixture's tritonserver without holding up the next test.

A deployment's server takes 5-7 s to stop, nearly all of it waiting: Triton unloads the instances
of a model one after another (each Python stub exits in about a second, its interpreter
finalizing torch and transformers), polls the unloading every second, and at the deployment's
exit timeout (5 s) gives up on models still unloading. A fixture whose server no test needs any
more hands it to :func:`stop_later`; ``conftest.py`` waits for every such stop at the session's
end (``pytest_sessionfinish``), so no server outlives the session. A test that checks what a stop
leaves behind stops its server itself, in the test.

A module of its own (not ``conftest``): test modules import it by name, and one module object
holds the list the session joins.
"""

from __future__ import annotations

import threading

from tests.budget import background_cost

STOPPING: list[threading.Thread] = []


def stop_later(server) -> None:
    """``server.stop()`` in a thread, joined by :func:`join_all` at the session's end. Its CPU (the
    server's and its stubs', reaped when it ends) is charged to no test's budget: it would land on
    whichever quick test runs meanwhile (``tests.budget.background_cost``)."""
    thread = threading.Thread(target=_stop, args=(server,), name=f"stop {getattr(server, 'pid', '')}")
    thread.start()
    STOPPING.append(thread)


def _stop(server) -> None:
    with background_cost():
        server.stop()


def join_all() -> None:
    while STOPPING:
        STOPPING.pop().join()
