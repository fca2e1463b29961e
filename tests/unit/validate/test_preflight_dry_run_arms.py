"""The preflight dry-runs serve's CPU pinning over the arms the config has, as render would decide
them: a baseline-only config (``speculation.method: none``) with explicit ``reference.cpu_pinning``
is checked, not crashed by asking for a speculative arm it does not have (issue 45)."""

from __future__ import annotations

from pipeline.config import parse_config
from pipeline.infra.cpu_pinning import allowed_cpus
from pipeline.validate.preflight import run_preflight


def test_a_baseline_only_config_with_explicit_pinning_is_checked():
    every = sorted(allowed_cpus())
    cfg = parse_config({"name": "pin", "backend": "reference", "hardware": "cpu",
                        "target": {"checkpoint": "builtin:tiny-target"}, "speculation": {"method": "none"},
                        "reference": {"cpu_pinning": every, "threads": 1}})
    pinning = [f for f in run_preflight(cfg, offline=True) if f.check == "cpu-ids"]
    assert pinning and all(f.severity == "error" and "leave one for the server" in f.message for f in pinning)
