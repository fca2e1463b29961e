"""Invalid configs are rejected before any work: one `field.path: message` line per problem, a
non-zero exit and no traceback. Each case is a valid base config plus one mutation."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from pipeline.cli import main
from pipeline.config import load_config, parse_config
from pipeline.errors import ConfigError
from tests.unit.cli_inproc import specdeploy

ROOT = Path(__file__).resolve().parents[3]
DELETE = object()

BASE = {
    "name": "base-valid",
    "backend": "trtllm",
    "hardware": "h100-sxm-80gb",
    "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct", "quantization": {"format": "fp8"}},
    "speculation": {
        "method": "draft_target",
        "draft": {"checkpoint": "/models/Llama-3.2-1B-Instruct"},
        "num_draft_tokens": 4,
    },
    "build": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048},
    "triton": {"kv_cache_free_gpu_mem_fraction": 0.45},
    "loadtest": {"concurrency": [1, 2, 4]},
}
MEDUSA = {"method": "medusa", "heads_dir": "/models/medusa-vicuna-7b-v1.3", "num_heads": 2}
EAGLE = {"method": "eagle", "head_dir": "/models/EAGLE-LLaMA3-Instruct-8B", "num_layers": 3}


def mutate(base: dict, changes: dict) -> dict:
    data = copy.deepcopy(base)
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return data


# (id, changes, expected text of the problem line)
CASES = [
    ("missing-name", {"name": DELETE}, "name: required field is missing"),
    ("missing-target", {"target": DELETE}, "target: required field is missing"),
    ("missing-checkpoint", {"target.checkpoint": DELETE}, "target.checkpoint: required field is missing"),
    ("unknown-top-field", {"nmae": "x"}, "nmae: unknown field"),
    ("unknown-nested-field", {"target.quantisation": {}}, "target.quantisation: unknown field"),
    ("bad-name", {"name": "my deployment!"}, "name: String should match pattern"),
    ("bad-backend", {"backend": "tensorrt"}, "backend: Input should be 'trtllm' or 'reference'"),
    ("unknown-hardware", {"hardware": "h100"}, "hardware: unknown hardware profile 'h100'; valid: h100-sxm-80gb"),
    ("bad-version", {"trtllm_version": "latest"}, "trtllm_version: 'latest' is not a TensorRT-LLM version"),
    ("empty-checkpoint", {"target.checkpoint": " "}, "target.checkpoint: must be a checkpoint directory"),
    ("builtin-without-name", {"target.checkpoint": "builtin:"}, "target.checkpoint: 'builtin:' needs a demo model name"),
    ("bad-dtype", {"target.dtype": "fp16"}, "target.dtype: Input should be 'float32', 'float16' or 'bfloat16'"),
    ("tp-zero", {"target.tp": 0}, "target.tp: Input should be greater than or equal to 1"),
    ("tp-wrong-type", {"target.tp": "two"}, "target.tp: Input should be a valid integer"),
    ("pp-negative", {"target.pp": -1}, "target.pp: Input should be greater than or equal to 1"),
    ("bad-format", {"target.quantization.format": "fp4"}, "target.quantization.format: Input should be 'none'"),
    ("bad-kv-dtype", {"target.quantization.kv_cache_dtype": "e4m3"}, "target.quantization.kv_cache_dtype: Input should be"),
    ("calib-zero", {"target.quantization.calibration_size": 0}, "target.quantization.calibration_size: Input should be greater than 0"),
    ("awq-block", {"target.quantization.awq_block_size": 100}, "target.quantization.awq_block_size: Input should be 64 or 128"),
    ("target-not-mapping", {"target": "/models/x"}, "target: Input should be a valid dictionary"),
    ("unknown-method", {"speculation": {"method": "redrafter"}}, "speculation: unknown method 'redrafter'"),
    ("method-missing", {"speculation": {"heads_dir": "/h"}}, "speculation: needs a 'method' field"),
    ("draft-missing", {"speculation.draft": DELETE}, "speculation.draft: required field is missing"),
    ("draft-unknown-field", {"speculation.draft.chekpoint": "/d"}, "speculation.draft.chekpoint: unknown field"),
    ("draft-tokens-zero", {"speculation.num_draft_tokens": 0}, "speculation.num_draft_tokens: Input should be greater than or equal to 1"),
    ("draft-tokens-too-many", {"speculation.num_draft_tokens": 64}, "speculation.num_draft_tokens: Input should be less than or equal to 32"),
    ("max-draft-below-k", {"speculation.max_draft_len": 2}, "speculation.max_draft_len: max_draft_len (2) is below num_draft_tokens (4)"),
    ("medusa-no-heads-dir", {"speculation": {"method": "medusa"}}, "speculation.heads_dir: required field is missing"),
    ("medusa-missing-prefix", {"speculation": {**MEDUSA, "choices": [[0], [1, 0]]}}, "speculation.choices: path [1, 0] needs its prefix [1] in the tree"),
    ("medusa-too-deep", {"speculation": {**MEDUSA, "choices": [[0], [0, 0], [0, 0, 0]]}}, "speculation.choices: tree depth 3 exceeds num_heads (2)"),
    ("medusa-duplicate-path", {"speculation": {**MEDUSA, "choices": [[0], [0]]}}, "speculation.choices: path [0] appears twice"),
    ("medusa-empty-path", {"speculation": {**MEDUSA, "choices": [[]]}}, "speculation.choices: contains an empty path"),
    ("medusa-empty-tree", {"speculation": {**MEDUSA, "choices": []}}, "speculation.choices: needs at least one path"),
    ("medusa-negative-index", {"speculation": {**MEDUSA, "choices": [[-1]]}}, "speculation.choices[0][0]: Input should be greater than or equal to 0"),
    ("medusa-choices-not-list", {"speculation": {**MEDUSA, "choices": "0,1"}}, "speculation.choices: Input should be a valid list"),
    ("medusa-nodes-over-limit", {"speculation": {**MEDUSA, "choices": [[0], [1], [0, 0]], "max_draft_len": 2}}, "speculation.max_draft_len: the tree has 3 nodes but max_draft_len is 2"),
    ("medusa-too-many-heads", {"speculation": {**MEDUSA, "num_heads": 9}}, "speculation.num_heads: Input should be less than or equal to 8"),
    ("eagle-depth-mismatch", {"speculation": {**EAGLE, "choices": [[0], [0, 0]]}}, "speculation.choices: tree depth 2 must equal num_layers (3)"),
    ("eagle-non-leaves", {"speculation": {**EAGLE, "num_layers": 2, "max_non_leaves_per_layer": 1, "choices": [[0], [1], [0, 0], [1, 0]]}}, "speculation.max_non_leaves_per_layer: the tree has 2 non-leaf nodes on one level"),
    ("eagle-draft-len-over-256", {"speculation": {**EAGLE, "max_draft_len": 300}}, "speculation.max_draft_len: Input should be less than or equal to 256"),
    ("eagle-unknown-field-from-medusa", {"speculation": {**EAGLE, "heads_dir": "/h"}}, "speculation.heads_dir: unknown field"),
    ("batch-zero", {"build.max_batch_size": 0}, "build.max_batch_size: Input should be greater than or equal to 1"),
    ("input-not-below-seq", {"build.max_input_len": 4096}, "build.max_input_len: max_input_len (4096) must be below max_seq_len (2048)"),
    ("beam-too-wide", {"build.max_beam_width": 16}, "build.max_beam_width: Input should be less than or equal to 8"),
    ("port-clash", {"triton.grpc_port": 8000}, "triton.grpc_port: port 8000 clashes with triton.http_port"),
    ("port-out-of-range", {"triton.http_port": 70000}, "triton.http_port: Input should be less than or equal to 65535"),
    ("kv-fraction-above-one", {"triton.kv_cache_free_gpu_mem_fraction": 1.5}, "triton.kv_cache_free_gpu_mem_fraction: Input should be less than or equal to 1"),
    ("bad-batching-strategy", {"triton.batching_strategy": "static"}, "triton.batching_strategy: Input should be"),
    ("no-concurrency", {"loadtest.concurrency": []}, "loadtest.concurrency: needs at least one concurrency level"),
    ("concurrency-repeats", {"loadtest.concurrency": [1, 1]}, "loadtest.concurrency: concurrency levels repeat"),
    ("concurrency-zero", {"loadtest.concurrency": [0, 2]}, "loadtest.concurrency[0]: Input should be greater than or equal to 1"),
    ("open-without-rates", {"loadtest.mode": "open"}, "loadtest.request_rate: mode 'open' needs request_rate levels"),
    ("warmup-too-long", {"loadtest.warmup_s": 30}, "loadtest.warmup_s: warmup_s (30.0) must be shorter than duration_s (20.0)"),
    ("duration-negative", {"loadtest.duration_s": -5}, "loadtest.duration_s: Input should be greater than 0"),
    ("bad-transport", {"loadtest.transport": "websocket"}, "loadtest.transport: Input should be 'grpc', 'http' or 'openai'"),
    ("temperature-negative", {"loadtest.sampling.temperature": -0.5}, "loadtest.sampling.temperature: Input should be greater than or equal to 0"),
    ("fail-fast-rate-one", {"loadtest.fail_fast_error_rate": 1.0}, "loadtest.fail_fast_error_rate: Input should be less than 1"),
    ("top-p-above-one", {"loadtest.sampling.top_p": 1.5}, "loadtest.sampling.top_p: Input should be less than or equal to 1"),
    ("sweep-over-engine-limit", {"loadtest.sweep_draft_len": [2, 8]}, "loadtest.sweep_draft_len: [8] exceed the engine max_draft_len (4)"),
    ("sweep-without-draft-target", {"speculation": {"method": "none"}, "loadtest.sweep_draft_len": [2]}, "loadtest.sweep_draft_len: only draft_target sends num_draft_tokens"),
    ("bad-orchestration", {"speculation.orchestration": "client"}, "speculation.orchestration: Input should be 'bls' or 'engine'"),
    ("engine-orchestration-on-trtllm", {"speculation.orchestration": "engine"}, "speculation.orchestration: 'engine' needs backend 'reference'"),
    ("engine-orchestration-with-sweep", {"backend": "reference", "hardware": "cpu", "target.quantization": DELETE, "speculation.orchestration": "engine", "loadtest.sweep_draft_len": [2]}, "loadtest.sweep_draft_len: needs speculation.orchestration 'bls'"),
    ("gate-level-not-tested", {"gate.target_concurrency": [3]}, "gate.target_concurrency: [3] are not load-test concurrency levels"),
    ("alpha-one", {"gate.alpha": 1.0}, "gate.alpha: Input should be less than 1"),
    ("few-resamples", {"gate.bootstrap_resamples": 10}, "gate.bootstrap_resamples: Input should be greater than or equal to 100"),
    ("bad-compute-dtype", {"reference.compute_dtype": "float16"}, "reference.compute_dtype: Input should be 'float32' or 'float64'"),
    ("bad-draft-weights", {"reference.draft_weights": "int4"}, "reference.draft_weights: Input should be 'float' or 'int8'"),
    ("bad-cpu-pinning", {"reference.cpu_pinning": "sometimes"}, "reference.cpu_pinning: should be 'auto', 'off' or a non-empty list of CPU ids"),
    ("negative-cpu-id", {"reference.cpu_pinning": [-1]}, "reference.cpu_pinning: should be 'auto', 'off' or a non-empty list of CPU ids (integers ≥ 0), got [-1]"),
    ("bool-as-text", {"triton.decoupled": "maybe"}, "triton.decoupled: Input should be a valid boolean"),
]


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "deploy.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return path


def _cli(capsys, *argv: str) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(list(argv))
    return exit_info.value.code, capsys.readouterr().err


def test_base_config_is_valid(tmp_path, capsys):
    path = _write(tmp_path, BASE)
    load_config(path)
    code, err = _cli(capsys, "validate", str(path), "--offline")
    assert code == 0, err


def test_enough_distinct_cases():
    assert len(CASES) >= 40
    assert len({c[0] for c in CASES}) == len(CASES)
    assert len({c[2] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("changes,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_invalid_config_is_one_clear_line(tmp_path, capsys, changes, expected):
    path = _write(tmp_path, mutate(BASE, changes))
    with pytest.raises(ConfigError) as exc_info:
        load_config(path)
    problems = exc_info.value.problems
    assert any(p.startswith(expected) for p in problems), problems
    code, err = _cli(capsys, "validate", str(path), "--offline")
    assert code == 2  # a config error
    assert "Traceback" not in err
    assert err.startswith(f"error: {path}: {len(problems)} problem(s)")
    assert f"  {expected}" in err


@pytest.mark.parametrize(
    "text,expected",
    [
        ("name: [unclosed\ntarget: {}\n", "(yaml) (line"),
        ("- just\n- a list\n", "(top level): expected a mapping of fields, got list"),
        ("", "(top level): expected a mapping of fields, got NoneType"),
        ("name: x\ntarget:\n\tcheckpoint: /m\n", "(yaml) (line 3"),
    ],
    ids=["unclosed-bracket", "top-level-list", "empty-file", "tab-indent"],
)
def test_unparseable_files(tmp_path, capsys, text, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(text, encoding="utf-8")
    code, err = _cli(capsys, "validate", str(path), "--offline")
    assert code == 2 and "Traceback" not in err  # a config error
    assert expected in err


def test_all_problems_reported_at_once():
    data = mutate(BASE, {"target.tp": 0, "triton.grpc_port": 8000, "loadtest.transport": "ws"})
    with pytest.raises(ConfigError) as exc_info:
        parse_config(data)
    paths = sorted(p.split(":")[0] for p in exc_info.value.problems)
    assert paths == ["loadtest.transport", "target.tp", "triton.grpc_port"]


def test_missing_file_is_a_config_error(tmp_path, capsys):
    code, err = _cli(capsys, "validate", str(tmp_path / "nope.yaml"))
    assert code == 2 and "no such config file" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "changes,expected",
    [({"nmae": "x"}, "nmae: unknown field"), ({"hardware": "tpu"}, "hardware: unknown hardware profile 'tpu'")],
)
def test_console_script_exits_nonzero_without_traceback(tmp_path, changes, expected):
    path = _write(tmp_path, mutate(BASE, changes))
    proc = specdeploy("validate", str(path), "--offline")  # the console script's main, in this process
    assert proc.returncode == 2  # a config error, not NO-GO
    assert "Traceback" not in proc.stderr
    assert expected in proc.stderr
