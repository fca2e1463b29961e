"""``locustfiles/fake_server.py`` started as a real HTTP server on a free loopback port, for the load
tests that need an endpoint but not an engine (the orchestrator, resume, repeats: auto)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


class Fake:
    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(ROOT / "locustfiles" / "fake_server.py"), *args],
                                     stdout=subprocess.PIPE, text=True)
        self.url = f"http://127.0.0.1:{int(self.proc.stdout.readline().split()[1])}"

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
