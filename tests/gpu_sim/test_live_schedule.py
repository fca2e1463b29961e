"""The live preflight's settings-class load sees a rendered schedule: the speculative arm's
model.yaml with the schedule's TensorRT-LLM form (pipeline/trtllm/schedule_forms.py) loads into the
installed classes of the simulated 1.2.1 image (tests/gpu_sim/trtllm_llm_args.py keeps the read
copy's draft_len_schedule validator), and a schedule in PR #10860's key shape, without key 1, is
refused there by the field's name."""

from __future__ import annotations

import pytest
import yaml

from pipeline.paths import model_repo_dir
from pipeline.trtllm.schedule_forms import trtllm_form
from pipeline.validate.live import PASS, failures, run_live_preflight
from tests.gpu_sim import hosts
from tests.gpu_sim.hosts import EAGLE3

pytestmark = pytest.mark.slow  # the preflight's child interpreters (docs/testing.md)


def _write(cfg, speculative_config: dict) -> None:
    path = model_repo_dir(cfg, "speculative") / "tensorrt_llm" / "1" / "model.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({"model": "/models/x", "max_batch_size": 8, "speculative_config": speculative_config,
                                    "triton_config": {"max_batch_size": 0, "decoupled": True}}))


def test_the_emitted_schedule_loads_and_a_keyless_one_is_refused(tmp_path, monkeypatch):
    h = hosts.enter(tmp_path, monkeypatch)
    try:
        cfg = h.config(EAGLE3)
        form = trtllm_form([(1, 2, 3), (3, 6, 2), (7, None, 0)], "Eagle3", cfg.trtllm_version)
        spec = {"decoding_type": "Eagle3", "speculative_model": "/models/head", **form["fields"]}
        _write(cfg, spec)
        checks = run_live_preflight(cfg)
        (row,) = [c for c in checks if c.check == "LLM args speculative model.yaml"]
        assert row.verdict == PASS, row.line()
        _write(cfg, {**spec, "draft_len_schedule": {4: 3, 8: 2, 32: 1}})
        (failed,) = [f for f in failures(run_live_preflight(cfg)) if "speculative model.yaml" in f.check]
        assert "draft_len_schedule" in failed.found
    finally:
        h.close()
