"""The LLM-API runtime in `validate`: the runtime field and its default per version, the methods
each runtime runs, and one failing case per rule of pipeline/trtllm/llmapi_facts.yaml (unknown
field, wrong type, out-of-bounds value, a field or mode one version has and another lacks, a
method the version or runtime does not run), each naming its field path — all offline, before any
GPU time. Checkpoint rules (EAGLE-3 head sizes, MTP's DeepSeek-family target) use small real
config.json / safetensors directories."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from pipeline.config import parse_config
from pipeline.errors import ConfigError
from pipeline.methods import METHODS
from pipeline.trtllm.llmapi_args import args_problems, llm_args
from pipeline.trtllm.llmapi_facts import facts_for, known_versions, release_line, type_ok
from pipeline.validate.preflight import errors_of, run_preflight

TARGET = "/models/Meta-Llama-3.1-8B-Instruct"
SPECS = {
    "none": {"method": "none"},
    "eagle3": {"method": "eagle3", "head_dir": "/models/EAGLE3-LLaMA3.1-Instruct-8B"},
    "draft_target": {"method": "draft_target", "draft": {"checkpoint": "/models/Llama-3.2-1B-Instruct"}},
    "ngram": {"method": "ngram"},
    "mtp": {"method": "mtp"},
    "medusa": {"method": "medusa", "heads_dir": "/models/medusa", "num_heads": 3},
    "eagle": {"method": "eagle", "head_dir": "/models/eagle", "num_layers": 3},
}


# the release lines past 1.2 exist as release candidates only (pipeline/trtllm/versions.yaml), which
# no recorded Triton image carries: the tests name the candidate and an image of their own
RELEASE_CANDIDATES = {"1.3.0": "1.3.0rc27", "1.4.0": "1.4.0rc4"}


def llm_cfg(method="eagle3", version="1.2.1", runtime="llm_api", target=TARGET, **top):
    version = RELEASE_CANDIDATES.get(version, version)
    if version != "1.2.1":
        top["triton"] = {"container_image": f"registry.example/trtllm-triton:{version}", **top.get("triton", {})}
    data = {"name": "api", "backend": "trtllm", "hardware": "h100-sxm-80gb", "trtllm_version": version,
            "target": {"checkpoint": target}, "speculation": SPECS[method],
            "build": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048}, **top}
    if runtime is not None:
        data["trtllm_runtime"] = runtime
    return parse_config(data)


def errors(cfg, offline=True):
    return errors_of(run_preflight(cfg, offline=offline))


def fields(cfg, offline=True):
    return {f.field for f in errors(cfg, offline)}


# ----------------------------------------------------------------------------------------------
# The runtime field


@pytest.mark.parametrize("version,runtime", [("1.2.1", "engine"), ("1.1.0", "engine"), ("1.3.0rc27", "llm_api"),
                                             ("1.4.0", "llm_api")])
def test_runtime_default_follows_the_version(version, runtime):
    assert llm_cfg("none", version, runtime=None).runtime == runtime


def test_versions_past_1_2_validate_on_llm_api_and_not_on_engine():
    assert errors(llm_cfg("eagle3", "1.4.0", runtime=None)) == []
    engine = errors(llm_cfg("none", "1.4.0", runtime="engine"))
    assert [f.field for f in engine] == ["trtllm_version"]
    assert "set trtllm_runtime: llm_api" in engine[0].fix


def test_unknown_runtime_is_a_config_error():
    with pytest.raises(ConfigError, match="trtllm_runtime"):
        llm_cfg(runtime="pytorch")


@pytest.mark.parametrize("method", ["none", "eagle3", "draft_target", "ngram"])
@pytest.mark.parametrize("version", ["1.2.1", "1.3.0", "1.4.0"])
def test_every_llm_api_method_validates_on_every_recorded_version(method, version):
    assert errors(llm_cfg(method, version)) == []


def test_generated_arguments_fit_every_recorded_version():
    """What the project emits exists, with its type, in each recorded release line."""
    for version in known_versions():
        for method in ("none", "eagle3", "draft_target", "ngram", "mtp"):
            cfg = llm_cfg(method, f"{version}.0")
            variant = "baseline" if method == "none" else "speculative"
            args = llm_args(cfg, {"baseline": "/m/t", "speculative": "/m/t", "draft": "/m/d"}, variant)
            assert args_problems(cfg, args) == [], (version, method)


# ----------------------------------------------------------------------------------------------
# Methods × runtime × backend


@pytest.mark.parametrize("method,word", [("medusa", "MedusaDecodingConfig.supports_backend"), ("eagle", "EAGLE-3")])
def test_medusa_and_eagle1_are_engine_only_with_the_upstream_reference(method, word):
    (error,) = errors(llm_cfg(method, "1.2.1"))
    assert error.field == "speculation.method" and "engine-only" in error.message and word in error.message
    assert "tensorrt_llm/llmapi/llm_args.py" in error.message or "tensorrt-backend-removal" in error.message


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_llm_api_methods_refused_on_the_engine_runtime(method):
    found = errors(llm_cfg(method, "1.2.1", runtime="engine"))
    assert "speculation.method" in {f.field for f in found}
    assert any("set trtllm_runtime: llm_api" in f.fix for f in found)


def test_in_engine_ngram_refused_on_the_engine_runtime_with_the_bls_route_named():
    # the engine runtime drafts n-grams only through the BLS (external drafts, docs/ngram.md)
    found = errors(llm_cfg("ngram", "1.2.1", runtime="engine"))
    assert "speculation.orchestration" in {f.field for f in found}
    assert any("orchestration: bls" in f.fix and "trtllm_runtime: llm_api" in f.fix for f in found)


@pytest.mark.parametrize("method", ["mtp"])
def test_llm_api_methods_refused_on_the_cpu_reference_engine(method):
    cfg = parse_config({"name": "cpu", "backend": "reference", "hardware": "cpu",
                        "target": {"checkpoint": "builtin:tiny-target"}, "speculation": SPECS[method]})
    assert "speculation.method" in fields(cfg)


@pytest.mark.parametrize("method", ["ngram", "eagle3"])
def test_method_runs_on_the_cpu_reference_engine_too(method):
    cfg = parse_config({"name": "cpu", "backend": "reference", "hardware": "cpu",
                        "target": {"checkpoint": "builtin:tiny-target"}, "speculation": SPECS[method]})
    assert "speculation.method" not in fields(cfg)


@pytest.mark.parametrize("version", ["1.1.0", "1.5.0", "2.0"])
def test_version_without_recorded_facts(version):
    (error,) = [e for e in errors(llm_cfg("ngram", version)) if e.check != "version" or "recorded:" in e.message]
    assert error.field == "trtllm_version" and "recorded: 1.2, 1.3, 1.4" in error.message


# ----------------------------------------------------------------------------------------------
# One failing case per rule of the facts file


@pytest.mark.parametrize("extra,field,word", [
    ({"max_batch_sizee": 8}, "llm_api.extra_llm_args.max_batch_sizee", "unknown field"),
    ({"max_num_tokens": "lots"}, "llm_api.extra_llm_args.max_num_tokens", "expects int"),
    ({"enable_chunked_prefill": 1}, "llm_api.extra_llm_args.enable_chunked_prefill", "expects bool"),
    ({"kv_cache_config": {"free_gpu_mem": 0.5}}, "llm_api.extra_llm_args.kv_cache_config.free_gpu_mem", "unknown field"),
    ({"kv_cache_config": {"free_gpu_memory_fraction": 1.5}},
     "llm_api.extra_llm_args.kv_cache_config.free_gpu_memory_fraction", "must be ≤ 1"),
    ({"cuda_graph_config": {"batch_sizes": "1,2"}}, "llm_api.extra_llm_args.cuda_graph_config.batch_sizes",
     "expects list[int]?"),
])
def test_llm_argument_rules(extra, field, word):
    found = [f for f in errors(llm_cfg("none", llm_api={"extra_llm_args": extra})) if f.field == field]
    assert found and word in found[0].message, [f.line() for f in errors(llm_cfg("none", llm_api={"extra_llm_args": extra}))]


@pytest.mark.parametrize("method,version,extra,key,word", [
    ("ngram", "1.2.1", {"max_matching_ngram": 3}, "max_matching_ngram", "unknown field for NGramDecodingConfig"),
    ("ngram", "1.4.0", {"is_keep_all": "yes"}, "is_keep_all", "expects bool"),
    ("eagle3", "1.2.1", {"eagle3_model_arch": "llama2"}, "eagle3_model_arch", "literal[llama3|mistral_large3]"),
    ("eagle3", "1.2.1", {"eagle3_layers_to_capture": [1, "mid"]}, "eagle3_layers_to_capture", "set[int]?"),
    ("eagle3", "1.2.1", {"draft_len_schedule": {1: 3, 4: "two"}}, "draft_len_schedule", "dict[int,int]?"),
    ("mtp", "1.3.0", {"relaxed_topk": 0}, "relaxed_topk", "must be > 0"),
    ("eagle3", "1.3.0", {"acceptance_rate_threshold": 2.0}, "acceptance_rate_threshold", "must be ≤ 1"),
    # fields one release line has and the next dropped or renamed
    ("eagle3", "1.4.0", {"eagle_choices": [[0], [0, 0]]}, "eagle_choices", "unknown field for Eagle3DecodingConfig of TensorRT-LLM 1.4"),
    ("eagle3", "1.3.0", {"greedy_sampling": True}, "greedy_sampling", "unknown field"),
    ("ngram", "1.3.0", {"acceptance_window": 8}, "acceptance_window", "unknown field"),
    # one spelling per build: 1.2 keeps the read copy's acceptance_window (llmapi_facts.yaml 1.2 unverified)
    ("ngram", "1.2.1", {"acceptance_rate_window_size": 8}, "acceptance_rate_window_size", "unknown field"),
    ("mtp", "1.3.0", {"mtp_eagle_one_model": False}, "mtp_eagle_one_model", "unknown field"),
])
def test_speculative_config_rules(method, version, extra, key, word):
    target = "/models/DeepSeek-V3" if method == "mtp" else TARGET
    cfg = llm_cfg(method, version, target=target, llm_api={"extra_speculative_config": extra})
    found = [f for f in errors(cfg) if f.field == f"llm_api.extra_speculative_config.{key}"]
    assert found and word in found[0].message, [f.line() for f in errors(cfg)]


@pytest.mark.parametrize("method,version,extra", [
    ("eagle3", "1.2.1", {"eagle_choices": [[0], [0, 0]]}),
    ("eagle3", "1.2.1", {"greedy_sampling": True}),
    ("ngram", "1.2.1", {"acceptance_window": 8}),
    ("ngram", "1.4.0", {"acceptance_rate_window_size": 8, "spec_dec_variant": 1}),
])
def test_the_same_fields_pass_on_the_line_that_has_them(method, version, extra):
    assert errors(llm_cfg(method, version, llm_api={"extra_speculative_config": extra})) == []


def test_speculative_fields_without_a_speculative_method():
    cfg = llm_cfg("none", llm_api={"extra_speculative_config": {"max_draft_len": 3}})
    assert fields(cfg) == {"llm_api.extra_speculative_config"}


@pytest.mark.parametrize("version,ok", [("1.2.1", True), ("1.3.0", False), ("1.4.0", False)])
def test_two_model_eagle3_only_where_the_version_has_it(version, ok):
    cfg = llm_cfg("eagle3", version, llm_api={})
    two = parse_config({**cfg.model_dump(mode="json"), "speculation": {**SPECS["eagle3"], "model_mode": "two_model"}})
    found = fields(two)
    assert (found == set()) if ok else (found == {"speculation.model_mode"}), found
    assert ("eagle3_one_model" in facts_for(version).decoding_type("Eagle3")["fields"]) is ok


def test_draft_target_engine_settings_refused_on_llm_api():
    cfg = parse_config({**llm_cfg("draft_target").model_dump(mode="json"),
                        "speculation": {**SPECS["draft_target"], "use_draft_logits": True, "max_draft_len": 8},
                        "build": {"max_batch_size": 8, "max_input_len": 1024, "max_seq_len": 2048,
                                  "gather_generation_logits": True},
                        "loadtest": {"sweep_draft_len": [2, 4]}})
    assert {"speculation.use_draft_logits", "loadtest.sweep_draft_len"} <= fields(cfg)


@pytest.mark.parametrize("section,value,field", [
    ("format", "int8_sq", "target.quantization.format"),
    ("format", "nvfp4", "target.quantization.format"),
    ("kv_cache_dtype", "int8", "target.quantization.kv_cache_dtype"),
])
def test_quantization_the_llm_api_plan_cannot_export(section, value, field):
    data = llm_cfg("none").model_dump(mode="json")
    data["target"]["quantization"][section] = value
    assert field in fields(parse_config(data))


def test_fp8_on_ampere_is_refused_on_llm_api_as_on_engines():
    data = llm_cfg("none").model_dump(mode="json")
    data.update(hardware="a100-80gb")
    data["target"]["quantization"]["format"] = "fp8"
    assert "target.quantization.format" in fields(parse_config(data))
    data["target"]["quantization"]["format"] = "int4_awq"
    assert errors(parse_config(data)) == []


# ----------------------------------------------------------------------------------------------
# MTP target and EAGLE-3 head, read from config.json


def _checkpoint(directory: Path, **config) -> Path:
    directory.mkdir(parents=True)
    base = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    (directory / "config.json").write_text(json.dumps({**base, **config}))
    save_file({"w": np.zeros((2, 2), np.float32)}, str(directory / "model.safetensors"))
    (directory / "tokenizer.json").write_text("{}")
    return directory


def test_mtp_needs_a_deepseek_family_target_offline():
    (error,) = errors(llm_cfg("mtp", target=TARGET))
    assert error.field == "target.checkpoint" and "DeepSeek-family" in error.message
    assert "LlamaForCausalLM" in error.message


def test_mtp_target_read_from_config_json(tmp_path):
    deepseek = _checkpoint(tmp_path / "ds", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
                           num_nextn_predict_layers=1)
    assert [f for f in errors(llm_cfg("mtp", target=str(deepseek)), offline=False) if f.check == "method"] == []
    stripped = _checkpoint(tmp_path / "ds-no-mtp", architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3")
    found = [f for f in errors(llm_cfg("mtp", target=str(stripped)), offline=False) if f.check == "method"]
    assert [f.field for f in found] == ["target.checkpoint"] and "num_nextn_predict_layers" in found[0].message
    llama = _checkpoint(tmp_path / "llama")
    assert "target.checkpoint" in fields(llm_cfg("mtp", target=str(llama)), offline=False)


def _eagle3_cfg(tmp_path, **head):
    target = _checkpoint(tmp_path / "target")
    head_dir = _checkpoint(tmp_path / "eagle3", architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=16, **head)
    data = llm_cfg("eagle3", target=str(target)).model_dump(mode="json")
    data["speculation"]["head_dir"] = str(head_dir)
    return parse_config(data), head_dir


def test_eagle3_head_matching_the_target_passes(tmp_path):
    cfg, _ = _eagle3_cfg(tmp_path)
    assert [f.line() for f in errors(cfg, offline=False) if f.field == "speculation.head_dir"] == []


@pytest.mark.parametrize("key,value", [("hidden_size", 48), ("vocab_size", 128)])
def test_eagle3_head_sizes_must_match_the_target(tmp_path, key, value):
    cfg, _ = _eagle3_cfg(tmp_path, **{key: value})
    found = [f for f in errors(cfg, offline=False) if f.field == "speculation.head_dir"]
    assert len(found) == 1 and f"EAGLE-3 head {key} {value}" in found[0].message


def test_eagle3_head_files_are_required(tmp_path):
    cfg, head_dir = _eagle3_cfg(tmp_path)
    (head_dir / "model.safetensors").unlink()
    found = [f for f in errors(cfg, offline=False) if f.field == "speculation.head_dir"]
    assert found and "EAGLE-3 head: *.safetensors or pytorch_model*.bin missing" in found[0].message


# ----------------------------------------------------------------------------------------------
# The facts file itself


def test_facts_cover_every_method_and_cite_upstream():
    for line in known_versions():
        facts = facts_for(f"{line}.0")
        assert facts.source["repo"] == "NVIDIA/TensorRT-LLM" and facts.source["path"] and facts.source["ref"]
        for decoding_type in {m.llmapi_decoding_type for m in METHODS.values()} - {None}:
            assert facts.decoding_type(decoding_type) is not None, (line, decoding_type)


@pytest.mark.parametrize("type_name,good,bad", [
    ("int", 3, True), ("int?", None, 1.5), ("float", 2, "2"), ("bool", False, 0), ("str?", "x", 3),
    ("list[int]?", [1, 2], [1, "2"]), ("list[list[int]]?", [[0], [0, 1]], [0, 1]),
    ("dict[int,int]?", {1: 4}, {"1": 4}), ("literal[a|b]", "b", "c"), ("object?", {}, []),
])
def test_type_language(type_name, good, bad):
    assert type_ok(type_name, good) and not type_ok(type_name, bad)


@pytest.mark.parametrize("version,line", [("1.2.1", "1.2"), ("1.3.0rc27", "1.3"), ("1.4", "1.4")])
def test_release_line(version, line):
    assert release_line(version) == line
