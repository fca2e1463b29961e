"""Per-request output lengths reach the server through the real Locust users (issue 46.2): each
prompt's drawn ``max_tokens`` is what its request asks for, and its record keeps it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "loadtests"))
sys.path.insert(0, str(ROOT / "tests" / "unit"))

from test_loadtest_fake_server import FakeServer, run_locust  # noqa: E402 - after the sys.path set-up above

import test_loadtest_fake_server  # noqa: E402 - after the sys.path set-up above


@pytest.mark.slow
def test_each_request_asks_for_its_own_max_tokens(tmp_path, monkeypatch):
    prompts = [{"id": f"p{i}", "category": "c", "prompt": f"prompt number {i}", "max_tokens": 3 + 4 * i}
               for i in range(6)]
    monkeypatch.setattr(test_loadtest_fake_server, "PROMPTS", prompts)
    server = FakeServer("--ttft-ms", "5", "--tpot-ms", "2", "--tokens-per-chunk", "1", "--max-tokens-cap", "64")
    try:
        records, _ = run_locust(tmp_path, server.port, users=2, duration_s=2, max_tokens=50)
    finally:
        server.close()
    done = [r for r in records if r["status"] == "ok"]
    assert len({r["prompt_id"] for r in done}) == 6, records[:2]
    wanted = {p["id"]: p["max_tokens"] for p in prompts}
    for r in done:
        assert r["osl"] == r["max_tokens"] == wanted[r["prompt_id"]]  # not the run's 50
        assert r["hit_max_tokens"] is True
