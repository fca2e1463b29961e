"""The quick tier's per-test CPU budget (tests/budget.py): a subprocess a background thread reaps
(a server stopped by ``server_stops.stop_later``) is charged to nobody, while a test's own
subprocess still is (the negative case)."""

from __future__ import annotations

import subprocess
import sys
import threading

from tests.budget import background_cost, cpu_s, uncharged_cpu_s

BURN = [sys.executable, "-c", "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"]


def charged() -> float:
    return cpu_s() - uncharged_cpu_s()


def test_a_subprocess_reaped_in_a_background_thread_is_charged_to_nobody():
    def stop():
        with background_cost():
            subprocess.run(BURN, check=True)

    before = charged()
    thread = threading.Thread(target=stop)
    thread.start()
    thread.join()
    assert charged() - before < 0.1


def test_a_subprocess_the_test_reaps_itself_is_charged():
    before = charged()
    subprocess.run(BURN, check=True)
    assert charged() - before >= 0.25
