"""The CPU llmapi model reads a schedule from model.yaml as TensorRT-LLM's drafter would:
``max_concurrency`` and ``draft_len_schedule`` become the reference engine's K per batch-size range
(pipeline/triton_models/llmapi_spec.py); a schedule whose keys read differently under the two
upstream meanings (lowest vs highest batch size of a K, PR #10860) is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.artefacts.engine import EngineDescriptor, NoProposer
from pipeline.artefacts.schedule import draft_len_at
from pipeline.triton_models import llmapi_spec


def _base(tmp_path: Path) -> EngineDescriptor:
    return EngineDescriptor(role="baseline", model_dir=str(tmp_path / "target"), proposer=NoProposer())


def _descriptor(tmp_path, **spec):
    spec = {"decoding_type": "NGram", "max_draft_len": 4, **spec}
    return llmapi_spec.engine_descriptor({"model": str(tmp_path / "target"), "max_batch_size": 16,
                                          "speculative_config": spec}, _base(tmp_path))


def test_max_concurrency_switches_speculation_off_above_it(tmp_path):
    d = _descriptor(tmp_path, max_concurrency=3)
    assert [draft_len_at(d.draft_len_schedule, b) for b in (1, 3, 4, 16, 40)] == [4, 4, 0, 0, 0]


def test_both_ends_schedule_gives_each_range_its_k(tmp_path):
    d = _descriptor(tmp_path, draft_len_schedule={1: 4, 2: 4, 3: 2, 6: 2, 7: 0})
    assert [draft_len_at(d.draft_len_schedule, b) for b in range(1, 10)] == [4, 4, 2, 2, 2, 2, 0, 0, 0]


def test_a_schedule_whose_keys_read_two_ways_is_refused(tmp_path):
    with pytest.raises(llmapi_spec.SpecError, match="lowest key"):
        _descriptor(tmp_path, draft_len_schedule={1: 4, 4: 2, 8: 0})


def test_no_schedule_fields_no_schedule(tmp_path):
    assert _descriptor(tmp_path).draft_len_schedule is None
