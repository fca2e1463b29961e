"""The ``ngram`` speculation method: config validation (one failing case per rule, each naming
its field), the build plan's engine step, the engine.json it writes (``build_step engine``),
and ``specdeploy bench`` rows for it on tiny random checkpoints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # tests.reference_fixtures under plain `pytest`

import pytest

from pipeline.build import reference_step as build_step
from pipeline.cli import run
from pipeline.config import load_config, parse_config
from pipeline.errors import ConfigError
from pipeline.methods.ngram import NgramSpec
from tests.reference_fixtures import one_thread, shared_checkpoints

ROOT = Path(__file__).resolve().parents[3]


def _data(speculation: dict, backend: str = "reference") -> dict:
    return {"name": "ng", "backend": backend, "hardware": "cpu" if backend == "reference" else "h100-sxm-80gb",
            "target": {"checkpoint": "builtin:tiny-target"}, "speculation": speculation}


def test_defaults_follow_tensorrt_llm():
    spec = parse_config(_data({"method": "ngram", "max_draft_len": 3})).speculation
    assert isinstance(spec, NgramSpec)
    assert (spec.max_matching_ngram_size, spec.min_matching_ngram_size) == (2, 1)
    assert spec.is_keep_all and spec.is_use_oldest and spec.is_public_pool
    assert spec.engine_max_draft_len == 3


@pytest.mark.parametrize(("speculation", "backend", "expected"), [
    ({"method": "ngram", "max_draft_len": 0}, "reference", "speculation.max_draft_len: Input should be greater"),
    ({"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 2, "min_matching_ngram_size": 3},
     "reference", "speculation.min_matching_ngram_size: min_matching_ngram_size (3) exceeds"),
    ({"method": "ngram", "max_draft_len": 4, "prompt_lookup_max": 3}, "reference",
     "speculation.prompt_lookup_max: unknown field"),
    ({"method": "ngram", "max_draft_len": 4, "max_matching_ngram_size": 3, "min_matching_ngram_size": 2}, "trtllm",
     "speculation.min_matching_ngram_size: must be 1 on backend trtllm: TensorRT-LLM's NGramDecodingConfig"),
])
def test_invalid_ngram_configs_name_the_field(speculation, backend, expected):
    # also: the trtllm refusal cites upstream (tensorrt_llm/llmapi/llm_args.py), checked by the prefix
    with pytest.raises(ConfigError) as err:
        parse_config(_data(speculation, backend))
    assert any(line.startswith(expected) for line in err.value.problems), err.value.problems


def test_one_spec_serves_llm_api_upstream_fields_and_pool_switches_as_written():
    from pipeline.trtllm.llmapi_args import speculative_config

    data = _data({"method": "ngram", "max_draft_len": 5, "max_matching_ngram_size": 3, "is_public_pool": False},
                 "trtllm")
    data.update(trtllm_version="1.4.0", trtllm_runtime="llm_api")
    cfg = parse_config(data)
    assert speculative_config(cfg, {}) == {"decoding_type": "NGram", "max_draft_len": 5,
                                           "max_matching_ngram_size": 3, "is_public_pool": False}


def test_tiny_config_plans_an_ngram_engine_without_checkpoint(tmp_path):
    from pipeline.plan.planner import make_plan

    cfg = load_config(ROOT / "configs" / "tiny-cpu-ngram.yaml")
    plan = make_plan(cfg)
    step = next(s for s in plan.steps if s.name == "engine-speculative")
    argv = step.argv
    at = argv.index("--method")
    assert argv[at : at + 14] == ["--method", "ngram", "--num-draft-tokens", "3", "--max-matching-ngram-size", "4",
                                  "--min-matching-ngram-size", "2", "--is-keep-all", "true", "--is-use-oldest",
                                  "true", "--is-public-pool", "false"]
    assert not any(s.name.startswith("resolve-") and s.name != "resolve-target" for s in plan.steps)
    # the step's argv, run as written, writes the proposer the engine reads
    model = shared_checkpoints()["target"]
    argv = list(argv[argv.index("engine"):])
    argv[argv.index("--out") + 1] = str(tmp_path / "spec")
    argv[argv.index("--model-dir") + 1] = str(model)
    argv[argv.index("--is-use-oldest") + 1] = "false"
    assert build_step.main(argv) == 0
    descriptor = json.loads((tmp_path / "spec" / "engine.json").read_text())
    assert descriptor["proposer"] == {"method": "ngram", "max_draft_len": 3, "max_matching_ngram_size": 4,
                                      "min_matching_ngram_size": 2, "is_keep_all": True, "is_use_oldest": False,
                                      "is_public_pool": False}
    assert descriptor["max_draft_len"] == 3


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_bench_gives_ngram_rows_per_category_and_batch(tmp_path):
    one_thread()
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    texts = {"copy": "w5 w9 w20 w31 w5 w9", "fresh": "w40 w41 w42 w43"}
    for cat, text in texts.items():
        (prompts / f"{cat}.jsonl").write_text(json.dumps({"id": f"{cat}-0", "category": cat, "prompt": text}))
    cfg = tmp_path / "bench.yaml"
    cfg.write_text(
        "name: bench-ngram\nbackend: reference\nhardware: cpu\n"
        f"target: {{checkpoint: {shared_checkpoints()['target']}, dtype: float32}}\n"
        "speculation: {method: ngram, max_draft_len: 3, max_matching_ngram_size: 2, is_public_pool: false}\n"
        "build: {max_batch_size: 8, max_input_len: 64, max_seq_len: 128}\n"
        f"loadtest: {{prompts: {prompts}}}\n")
    out = tmp_path / "report.json"
    assert run(["bench", str(cfg), "--json", "--prompts", "1", "--max-tokens", "12", "--peer", "hf",
                "--output", str(out)]) == 0
    report = json.loads(out.read_text())
    assert {(r["method"], r["batch"], r["category"]) for r in report["results"]} == {
        ("ngram", b, c) for b in (1, 8) for c in texts}
    for r in report["results"]:
        assert r["outputs_match"] and r["tokens"] == r["baseline_tokens"] > 0
        assert 1.0 <= r["tokens_per_target_pass"] <= r["mean_acceptance_length"] <= 4.0
    copy = next(r for r in report["results"] if r["category"] == "copy" and r["batch"] == 1)
    assert copy["acceptance_rate"] > 0  # the prompt's repeated opening is drafted from the first step
    assert "draft model" in report["peer"]["skipped"]
