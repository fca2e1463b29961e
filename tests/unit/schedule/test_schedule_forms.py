"""The schedule as each engine loads it: the TensorRT-LLM LLM-API speculative_config (loaded into
the 1.2 stand-in classes of tests/gpu_sim and checked against every recorded line's facts), vLLM's
num_speculative_tokens_per_batch_size, resolved with the lookup rules read upstream
(upstream_schedule_rules.yaml) to the schedule's K at every batch size; a one-engine drafter's
floor; and the engine runtime said plainly."""

from __future__ import annotations

import bisect

import pytest

from pipeline.artefacts.schedule import DraftLenRange, SpeculationSchedule
from pipeline.schedule.forms import all_forms, vllm_form
from pipeline.trtllm.llmapi_facts import facts_for, field_problems
from pipeline.trtllm.schedule_forms import trtllm_form
from tests.gpu_sim import trtllm_llm_args as stand_in


def sched(*ranges, method="draft_target") -> SpeculationSchedule:
    rs = [DraftLenRange(min_concurrency=lo, max_concurrency=hi, draft_len=k) for lo, hi, k in ranges]
    return SpeculationSchedule(name="t", run_dir="/r", method=method, max_draft_len=max(r.draft_len for r in rs),
                               off_from=next((r.min_concurrency for r in rs if r.draft_len == 0), None), ranges=rs)


VARYING = sched((1, 2, 4), (3, 6, 2), (7, 12, 1), (13, None, 0))
STEP = sched((1, 4, 3), (5, None, 0))


def lowest_key(schedule: dict[int, int], batch: int) -> int:
    keys = sorted(schedule)
    i = bisect.bisect_right(keys, batch)
    return schedule[keys[i - 1]] if i else 0


def highest_key(schedule: dict[int, int], batch: int) -> int:
    keys = sorted(schedule)
    i = bisect.bisect_left(keys, batch)
    return schedule[keys[i]] if i < len(keys) else 0


def vllm_lookup(entries: list[list[int]], batch: int, num_speculative_tokens: int) -> int:
    entries = sorted(entries)
    assert entries[0][0] == 1 and all(lo <= hi for lo, hi, _ in entries)
    assert all(a[1] < b[0] for a, b in zip(entries, entries[1:])), "overlapping ranges"
    assert all(k >= 0 for *_, k in entries)
    k = entries[0][2]
    for lo, _, kk in entries:
        if lo <= batch:
            k = kk
    return min(k, num_speculative_tokens)


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc29", "1.4.0rc4"])
def test_trtllm_schedule_means_the_same_k_under_both_readings_and_loads(version):
    form = trtllm_form(VARYING.triples(), "Draft_Target", version)
    fields = form["fields"]
    schedule = fields["draft_len_schedule"]
    for batch in range(1, 40):
        want = VARYING.draft_len_for(batch)
        assert lowest_key(schedule, batch) == want == highest_key(schedule, batch), batch
    facts = facts_for(version)
    assert field_problems(fields, facts.decoding_type("Draft_Target")["fields"], "speculative_config", version) == []
    loaded = stand_in.DecodingBaseConfig.from_dict({"decoding_type": "Draft_Target", **fields})
    assert loaded.draft_len_schedule[1] == loaded.max_draft_len == 4


def test_a_single_threshold_is_max_concurrency():
    fields = trtllm_form(STEP.triples(), "NGram", "1.3.0rc29")["fields"]
    assert fields == {"max_draft_len": 3, "max_concurrency": 4}
    stand_in.DecodingBaseConfig.from_dict({"decoding_type": "NGram", **fields})


def test_stand_in_refuses_what_the_form_avoids():
    """Without the key 1 (PR #10860's example shape) the read copy's validator refuses the schedule."""
    with pytest.raises(ValueError, match="batch_size=1"):
        stand_in.DecodingBaseConfig.from_dict({"decoding_type": "Draft_Target", "max_draft_len": 4,
                                               "draft_len_schedule": {4: 4, 8: 2, 32: 1}})


def test_one_engine_drafter_is_floored_at_one_not_switched_off():
    form = trtllm_form(STEP.triples(), "Eagle3", "1.4.0rc4")
    assert "max_concurrency" not in form["fields"]
    assert form["fields"]["draft_len_schedule"] == {1: 3, 4: 3, 5: 1}
    assert any("#16888" in n for n in form["notes"])


def test_rising_k_is_made_non_increasing_and_said():
    rising = sched((1, 1, 2), (2, 4, 4), (5, None, 0))
    form = trtllm_form(rising.triples(), "Draft_Target", "1.3.0rc29")
    assert form["fields"] == {"max_draft_len": 2, "max_concurrency": 4}  # one K left: a plain threshold
    assert any("non-increasing" in n for n in form["notes"])


def test_no_paying_level_emits_nothing_to_load():
    off = sched((1, None, 0))
    assert trtllm_form(off.triples(), "Draft_Target", "1.2.1")["fields"] == {}
    assert vllm_form(off)["config"] == {}


def test_vllm_form_resolves_to_the_schedule():
    config = vllm_form(VARYING, max_batch_size=64)["config"]
    assert config["method"] == "draft_model" and config["num_speculative_tokens"] == 4
    entries = config["num_speculative_tokens_per_batch_size"]
    assert entries[-1] == [13, 64, 0]
    for batch in range(1, 100):
        assert vllm_lookup(entries, batch, 4) == VARYING.draft_len_for(batch), batch


def test_engine_runtime_says_what_it_cannot_express():
    forms = all_forms(STEP)
    text = " ".join(forms["engine_runtime"])
    assert "no max_concurrency" in text and "no draft length per batch size" in text
    assert "route traffic above concurrency 4" in text
    medusa = all_forms(sched((1, 4, 3), (5, None, 0), method="medusa"))
    assert medusa["trtllm_llmapi"]["1.2.1"]["expressible"] is False


def test_a_line_without_draft_len_schedule_gets_max_concurrency_and_says_so(monkeypatch):
    """A release line whose recorded decoding config lacks the field: the nearest honest form is
    max_concurrency with K at concurrency 1, and the note says the lower K are lost."""
    from pipeline.trtllm import schedule_forms

    real = facts_for("1.2.1")

    class Older:
        line = "1.1"

        def decoding_type(self, name):
            entry = real.decoding_type(name)
            return {**entry, "fields": {k: v for k, v in entry["fields"].items() if k != "draft_len_schedule"}}

    monkeypatch.setattr(schedule_forms, "facts_for", lambda version: Older())
    form = schedule_forms.trtllm_form(VARYING.triples(), "Draft_Target", "1.1.0")
    assert form["fields"] == {"max_draft_len": 4, "max_concurrency": 12}
    assert any("records no draft_len_schedule" in n for n in form["notes"])
