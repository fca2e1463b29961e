"""Honest versions: `validate` accepts published releases, names release candidates as such (with
the facts carried over unverified), and refuses an image that carries another TensorRT-LLM."""

from __future__ import annotations

import pytest

from pipeline.config import load_config, parse_config
from pipeline.paths import PROJECT_ROOT
from pipeline.trtllm.versions import image_trtllm, images_carrying, releases, version_problems
from pipeline.validate.preflight import run_preflight

IMAGE = "nvcr.io/nvidia/tritonserver:{}-trtllm-python-py3"


def cfg(version: str, image: str | None = None, runtime: str = "llm_api"):
    data = {"name": "v", "backend": "trtllm", "hardware": "h100-sxm-80gb", "trtllm_version": version,
            "trtllm_runtime": runtime, "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct"},
            "speculation": {"method": "ngram"}}
    if image:
        data["triton"] = {"container_image": image}
    return parse_config(data)


def version_findings(config):
    return [f for f in run_preflight(config, offline=True) if f.check == "version"]


def test_the_recorded_images_carry_what_their_dockerfiles_pin():
    assert image_trtllm(IMAGE.format("26.04")) == "1.2.1" and image_trtllm(IMAGE.format("26.07")) == "1.2.1"
    assert image_trtllm(IMAGE.format("26.03")) == "1.2.0rc8"
    assert image_trtllm("registry.example/mine:1") is None
    assert IMAGE.format("26.04") in images_carrying("1.2.1")
    assert "1.4.0" not in releases() and releases()[-1] == "1.2.1"


def test_an_unpublished_version_is_refused_naming_the_candidates():
    (error,) = [f for f in version_findings(cfg("1.4.0", "registry.example/x:1")) if f.severity == "error"]
    assert error.field == "trtllm_version" and "never published" in error.message
    assert "release candidates only" in error.message and "1.4.0rc4" in error.message


def test_a_release_candidate_is_named_with_what_is_unverified():
    (warning,) = version_findings(cfg("1.4.0rc4", "registry.example/trtllm-triton:1.4.0rc4"))
    assert warning.severity == "warning" and "1.4.0rc4 is a release candidate" in warning.message
    assert "spec_dec_variant" in warning.message and "llm_args" in warning.message  # the 1.4 unverified facts
    assert "--live" in warning.fix


def test_an_image_that_carries_another_version_is_refused():
    errors = [f for f in version_findings(cfg("1.4.0rc4")) if f.severity == "error"]
    assert [f.field for f in errors] == ["triton.container_image"]
    assert "carries TensorRT-LLM 1.2.1" in errors[0].message and "r26.04" in errors[0].message
    assert 'set trtllm_version: "1.2.1"' in errors[0].fix


def test_a_version_no_image_carries_needs_an_explicit_image():
    problems = version_problems("1.1.0", "registry.example/x", image_explicit=False, unverified=[])
    assert [p.message for p in problems] == ["no recorded image carries TensorRT-LLM 1.1.0 (recorded: "
                                             "pipeline/trtllm/versions.yaml)"]
    assert version_problems("1.1.0", "registry.example/x", image_explicit=True, unverified=[]) == []


def test_1_2_1_lists_its_unverified_llmapi_facts_as_information():
    (info,) = version_findings(cfg("1.2.1"))
    assert info.severity == "info" and "speculative_model" in info.message and "Eagle3" in info.message


@pytest.mark.parametrize("name", ["llama31-70b-draft8b-llmapi-h100", "qwen25-coder-7b-ngram-llmapi-h100"])
def test_the_llmapi_example_configs_name_a_published_version_their_image_carries(name):
    config = load_config(PROJECT_ROOT / "configs" / f"{name}.yaml")
    assert config.trtllm_version == image_trtllm(config.triton.container_image) == "1.2.1"
    assert [f for f in version_findings(config) if f.severity != "info"] == []
