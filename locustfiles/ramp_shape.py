"""A closed-loop ramp as Locust's own load shape: ``loadtest.ramp`` steps of ``users`` for
``duration_s`` each, in one run (``LoadTestShape.tick``). Loaded beside the locustfile only for such
a run (``locust -f locustfile.py,ramp_shape.py``): a shape class in the locustfile itself would take
over every run. Reads the run settings the locustfile reads (``SPECDEPLOY_LOADTEST_CONFIG``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from locust import LoadTestShape

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lt_common import Clock, RunSettings  # after the path set-up above


class RampShape(LoadTestShape):
    """(users, spawn rate) of the ramp step running now; None after the last step ends the run."""

    def __init__(self) -> None:
        super().__init__()
        settings = RunSettings.from_env()
        ends, total = [], 0.0
        for step in settings.ramp:
            total += float(step["duration_s"])
            ends.append((total, int(step["users"])))
        self.steps = ends

    def tick(self):
        # the records' clock (lt_common.Clock, started at test start), so a step here is the step a record
        # names (ramp_step); before it exists the first step's users are being spawned
        now = Clock.current.now() / 1e9 if Clock.current is not None else 0.0
        for end, users in self.steps:
            if now < end:
                return users, users  # the whole step's users at once: a step, not a slope
        return None
