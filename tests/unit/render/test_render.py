"""`specdeploy render`: golden repositories per backend × method, protobuf parsing of every
config, template errors (syntax, missing value) failing render with the file named, the
validator's load-time rules (ensemble wiring, dtypes, batch sizes, decoding mode, DTM rules),
stale manifests and the load-test targets."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from pipeline.config import config_hash, parse_config
from pipeline.errors import StaleInputError
from pipeline.infra.trees import brace_choices
from pipeline.paths import PROJECT_ROOT, manifest_path
from pipeline.render.renderer import (
    TEMPLATES_DIR,
    client_target,
    load_manifest,
    render,
    render_repository,
)
from pipeline.render.triton_rules import RenderError, parse_config_file, validate_repository

GOLDEN = Path(__file__).parents[1] / "golden" / "render"
METHODS = {
    "none": {"method": "none"},
    "draft_target": {"method": "draft_target", "draft": {"checkpoint": "/models/Llama-3.2-1B-Instruct"}, "num_draft_tokens": 4},
    "medusa": {"method": "medusa", "heads_dir": "/models/medusa", "num_heads": 3},
    "eagle": {"method": "eagle", "head_dir": "/models/eagle", "num_layers": 2, "choices": [[0], [1], [0, 0]]},
    # n-gram drafted by the BLS, verified by the target as external drafts (docs/ngram.md)
    "ngram_bls": {"method": "ngram", "orchestration": "bls", "max_draft_len": 4, "max_matching_ngram_size": 3,
                  "is_public_pool": False},
    "lookahead": {"method": "lookahead", "max_window_size": 5, "max_ngram_size": 4, "max_verification_set_size": 3},
}
CASES = [(backend, method) for backend in ("reference", "trtllm") for method in METHODS]


@pytest.fixture(autouse=True)
def no_nvidia_smi(monkeypatch):
    """The goldens hold the placement for a host without nvidia-smi, whatever host runs them."""
    monkeypatch.setattr("pipeline.plan.gpu_layout.query_gpus", lambda nvidia_smi=None: None)


def make_cfg(backend: str, method: str, workdir: Path | None = None, **triton):
    data = {
        "name": f"golden-{backend}-{method.replace('_', '-')}", "backend": backend,
        # known example models: the GPU placement sizes the equal KV capacity from their shapes
        "target": {"checkpoint": "/models/Meta-Llama-3.1-8B-Instruct"}, "speculation": METHODS[method],
        "build": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256},
        "triton": triton,
    }
    if backend == "reference":
        data["hardware"] = "cpu"
    return parse_config(data, workdir=workdir)


def write_manifest(cfg) -> dict:
    keys = {"none": ["baseline"], "draft_target": ["baseline", "target", "draft", "speculative"],
            "medusa": ["baseline", "speculative"], "eagle": ["baseline", "speculative"],
            "ngram": ["baseline", "target"], "lookahead": ["baseline", "speculative"]}[cfg.method]
    manifest = {
        "format": "specdeploy-manifest/1", "name": cfg.name, "config_hash": config_hash(cfg),
        "backend": cfg.backend, "method": cfg.method, "trtllm_version": cfg.trtllm_version,
        "engines": {k: f"/engines/{cfg.name}/{k}" for k in keys}, "tokenizer_dir": "/models/target",
        "max_draft_len": 4, "num_draft_tokens": 4 if cfg.method == "draft_target" else None, "steps": [],
    }
    path = manifest_path(cfg)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return manifest


def repo_files(repo: Path) -> dict[str, str]:
    return {str(p.relative_to(repo)): p.read_text() for p in sorted(repo.rglob("config.pbtxt"))}


@pytest.mark.parametrize("backend,method", CASES, ids=[f"{b}-{m}" for b, m in CASES])
def test_render_matches_golden(tmp_path, backend, method):
    cfg = make_cfg(backend, method, workdir=tmp_path)
    write_manifest(cfg)
    results = render(cfg)
    assert set(results) == ({"baseline"} if method == "none" else {"baseline", "speculative"})
    for variant, (repo, warnings) in results.items():
        assert warnings == []
        for model_dir in repo.iterdir():
            config = parse_config_file(model_dir / "config.pbtxt")
            assert config.name == model_dir.name and (model_dir / "1").is_dir()
            if config.backend == "python":
                source = (model_dir / "1" / "model.py").read_text()
                compile(source, str(model_dir / "1" / "model.py"), "exec")
                module = source.split("from pipeline.triton_models.", 1)[1].split(" ", 1)[0]
                assert (model_dir / "1" / "_specdeploy" / "pipeline" / "triton_models" / f"{module}.py").is_file()
            else:
                assert not (model_dir / "1" / "model.py").exists()  # C++ tensorrtllm backend
        for path in repo.rglob("*.py"):  # nothing ties the repository to this checkout
            assert str(PROJECT_ROOT) not in path.read_text(), path
        golden_dir = GOLDEN / f"{backend}-{method}" / variant
        actual = repo_files(repo)
        if os.environ.get("UPDATE_GOLDEN") == "1":
            shutil.rmtree(golden_dir, ignore_errors=True)
            for rel, text in actual.items():
                (golden_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                (golden_dir / rel).write_text(text)
        expected = {str(p.relative_to(golden_dir)): p.read_text() for p in sorted(golden_dir.rglob("config.pbtxt"))}
        assert actual == expected, f"golden mismatch for {backend}-{method}/{variant} (UPDATE_GOLDEN=1 to accept)"


def test_method_specific_settings(tmp_path):
    cfg = make_cfg("trtllm", "draft_target", decoupled=True, workdir=tmp_path)
    write_manifest(cfg)
    (repo, _), = [render(cfg)["speculative"]]
    target = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
    draft = parse_config_file(repo / "tensorrt_llm_draft" / "config.pbtxt")
    bls = parse_config_file(repo / "tensorrt_llm_bls" / "config.pbtxt")
    assert target.backend == "tensorrtllm" and draft.name == "tensorrt_llm_draft"
    for llm in (target, draft):
        assert not llm.model_transaction_policy.decoupled
        assert llm.parameters["enable_kv_cache_reuse"].string_value == "True"
        assert llm.parameters["exclude_input_in_output"].string_value == "False"
    assert target.parameters["gpt_model_path"].string_value.endswith("/target")
    assert draft.parameters["gpt_model_path"].string_value.endswith("/draft")
    assert bls.parameters["tensorrt_llm_draft_model_name"].string_value == "tensorrt_llm_draft"
    assert bls.model_transaction_policy.decoupled  # our streaming-BLS extension


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_tree_choices_in_brace_format(tmp_path):
    for method, key, expected in (("medusa", "medusa_choices", "{0}, {0, 0}, {0, 0, 0}"),
                                  ("eagle", "eagle_choices", "{0}, {1}, {0, 0}")):
        cfg = make_cfg("trtllm", method, workdir=tmp_path)
        write_manifest(cfg)
        repo, _ = render(cfg)["speculative"]
        config = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
        assert config.parameters["decoding_mode"].string_value == method
        assert config.parameters[key].string_value == expected
    assert brace_choices([[0], [0, 1]]) == "{0}, {0, 1}"


def test_lookahead_parameters_match_the_engine(tmp_path):
    """decoding_mode lookahead and its three parameters, as the C++ backend reads them
    (tensorrtllm_backend r25.05 inflight_batcher_llm/src/model_instance_state.cc); the repository
    check refuses a lookahead model that lacks one (the backend would throw at load)."""
    cfg = make_cfg("trtllm", "lookahead", workdir=tmp_path)
    write_manifest(cfg)
    repo, _ = render(cfg)["speculative"]
    config = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
    got = {k: config.parameters[k].string_value for k in ("decoding_mode", "lookahead_window_size",
                                                         "lookahead_ngram_size", "lookahead_verification_set_size")}
    assert got == {"decoding_mode": "lookahead", "lookahead_window_size": "5", "lookahead_ngram_size": "4",
                   "lookahead_verification_set_size": "3"}
    assert config.parameters["max_beam_width"].string_value == "1"
    baseline = parse_config_file(render(cfg)["baseline"][0] / "tensorrt_llm" / "config.pbtxt")
    assert baseline.parameters["decoding_mode"].string_value == ""
    path = repo / "tensorrt_llm" / "config.pbtxt"
    text = path.read_text()
    assert 'key: "lookahead_ngram_size"\n    value: { string_value: "4" }' in text
    path.write_text(text.replace('key: "lookahead_ngram_size"\n    value: { string_value: "4" }',
                                 'key: "lookahead_ngram_size"\n    value: { string_value: "" }'))
    with pytest.raises(RenderError, match="decoding_mode lookahead needs lookahead_ngram_size"):
        validate_repository(repo)


def test_client_target():
    dt = make_cfg("reference", "draft_target")
    assert client_target(dt, "baseline").model_name == "tensorrt_llm_bls"
    assert client_target(dt, "baseline").extra_inputs == {}
    assert client_target(dt, "speculative").extra_inputs == {"num_draft_tokens": 4}
    assert client_target(make_cfg("reference", "medusa"), "speculative").model_name == "ensemble"
    with pytest.raises(Exception, match="variant 'speculative' does not exist"):
        client_target(make_cfg("reference", "none"), "speculative")


def test_stale_manifest_is_refused(tmp_path):
    cfg = make_cfg("reference", "medusa", workdir=tmp_path)
    write_manifest(cfg)
    other = make_cfg("reference", "medusa", decoupled=False, workdir=tmp_path)
    with pytest.raises(StaleInputError, match="re-run `specdeploy build`"):
        load_manifest(other)
    with pytest.raises(StaleInputError, match=r"does not exist: run `specdeploy build` for .* first"):
        load_manifest(make_cfg("trtllm", "none", workdir=tmp_path))  # missing manifest


def _broken_templates(tmp_path: Path, model: str, old: str, new: str) -> Path:
    templates = tmp_path / "templates"
    shutil.copytree(TEMPLATES_DIR, templates)
    path = templates / model / "config.pbtxt.jinja"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    return templates


def test_broken_template_fails_render_not_the_server(tmp_path):
    cfg = make_cfg("reference", "medusa", workdir=tmp_path)
    manifest = write_manifest(cfg)
    templates = _broken_templates(tmp_path, "postprocessing", "{{ postprocessing_instance_count }}", "{{ postprocessing_instance_count ")
    with pytest.raises(RenderError, match=r"postprocessing/config.pbtxt.jinja:\d+: template syntax error"):
        render_repository(cfg, manifest, "baseline", tmp_path / "repo", templates)
    assert not (tmp_path / "repo").exists()  # nothing half-written swapped in
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".repo")]


def test_missing_value_fails_render(tmp_path):
    cfg = make_cfg("reference", "medusa", workdir=tmp_path)
    manifest = write_manifest(cfg)
    templates = _broken_templates(tmp_path, "preprocessing", "m.param(\"tokenizer_dir\", tokenizer_dir)", "m.param(\"tokenizer_dir\", tokenizer_directory)")
    with pytest.raises(RenderError, match="preprocessing/config.pbtxt.jinja: missing value: 'tokenizer_directory' is undefined"):
        render_repository(cfg, manifest, "baseline", tmp_path / "repo", templates)


def test_protobuf_error_names_the_file(tmp_path):
    cfg = make_cfg("reference", "none", workdir=tmp_path)
    manifest = write_manifest(cfg)
    templates = _broken_templates(tmp_path, "ensemble", 'platform: "ensemble"', 'platform "ensemble" }')
    with pytest.raises(RenderError, match=r"ensemble/config.pbtxt: does not parse as a Triton ModelConfig"):
        render_repository(cfg, manifest, "baseline", tmp_path / "repo", templates)


def _rendered(tmp_path, method="medusa", variant="speculative") -> Path:
    cfg = make_cfg("reference", method, workdir=tmp_path)
    write_manifest(cfg)
    return render(cfg)[variant][0]


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_validator_catches_miswired_ensemble(tmp_path):
    repo = _rendered(tmp_path)
    ensemble = repo / "ensemble" / "config.pbtxt"
    _edit(ensemble, 'input_map { key: "input_lengths" value: "_REQUEST_INPUT_LEN" }', "")
    _edit(ensemble, 'input_map { key: "TOKENS_BATCH" value: "_TOKENS_BATCH" }',
          'input_map { key: "TOKENS_BATCH" value: "_NO_SUCH_TENSOR" }')
    _edit(ensemble, 'output_map { key: "OUT_END_ID" value: "_PREPROCESSOR_END_ID" }',
          'output_map { key: "OUT_END_ID" value: "_REQUEST_INPUT_LEN" }')
    with pytest.raises(RenderError) as info:
        validate_repository(repo)
    text = str(info.value)
    assert "required input tensorrt_llm.input_lengths is not mapped" in text
    assert "reads '_NO_SUCH_TENSOR', which no input or step provides" in text
    assert "tensor '_REQUEST_INPUT_LEN' is produced by both preprocessing and preprocessing" in text


def test_validator_dtype_and_batch_rules(tmp_path):
    repo = _rendered(tmp_path)
    _edit(repo / "postprocessing" / "config.pbtxt", 'name: "TOKENS_BATCH"\n    data_type: TYPE_INT32',
          'name: "TOKENS_BATCH"\n    data_type: TYPE_INT64')
    _edit(repo / "preprocessing" / "config.pbtxt", "max_batch_size: 4", "max_batch_size: 2")
    with pytest.raises(RenderError) as info:
        validate_repository(repo)
    assert "dtype mismatch on '_TOKENS_BATCH' → postprocessing.TOKENS_BATCH" in str(info.value)
    assert "ensemble max_batch_size 4 exceeds preprocessing's 2" in str(info.value)


def test_validator_name_version_and_duplicate_output(tmp_path):
    repo = _rendered(tmp_path)
    ensemble = repo / "ensemble" / "config.pbtxt"
    text = ensemble.read_text()
    block = text[text.index('  {\n    name: "kv_cache_alloc_total_blocks"'):]
    block = block[: block.index("  }") + 3]
    _edit(ensemble, block, block + ",\n" + block)  # upstream's duplicate declaration
    assert any("declared more than once" in w for w in validate_repository(repo))
    shutil.rmtree(repo / "postprocessing" / "1")
    _edit(repo / "preprocessing" / "config.pbtxt", 'name: "preprocessing"', 'name: "preproc"')
    with pytest.raises(RenderError) as info:
        validate_repository(repo)
    assert "version directory 1/ is missing" in str(info.value)
    assert "name 'preproc' differs from its directory 'preprocessing'" in str(info.value)


def test_validator_decoding_mode_and_decoupled(tmp_path):
    repo = _rendered(tmp_path)
    llm = repo / "tensorrt_llm" / "config.pbtxt"
    _edit(llm, 'key: "medusa_choices"\n    value: { string_value: "{0}, {0, 0}, {0, 0, 0}" }',
          'key: "medusa_choices"\n    value: { string_value: "" }')
    _edit(llm, "decoupled: true", "decoupled: false")
    with pytest.raises(RenderError) as info:
        validate_repository(repo)
    assert "decoding_mode medusa needs medusa_choices" in str(info.value)
    assert "decoupled (True) differs from tensorrt_llm (False)" in str(info.value)


def test_validator_engine_vs_decoding_mode(tmp_path):
    repo = _rendered(tmp_path, "none", "baseline")
    engine = tmp_path / "eng"
    engine.mkdir()
    (engine / "engine.json").write_text(json.dumps({"role": "speculative", "proposer": {"method": "eagle"}}))
    llm = repo / "tensorrt_llm" / "config.pbtxt"
    text = llm.read_text()
    old = text[text.index('key: "gpt_model_path"'):]
    old = old[: old.index("}") + 1]
    _edit(llm, old, f'key: "gpt_model_path"\n    value: {{ string_value: "{engine}" }}')
    with pytest.raises(RenderError, match="the engine was built for 'eagle' but decoding_mode is unset"):
        validate_repository(repo)


def test_validator_draft_target_needs_kv_reuse(tmp_path):
    repo = _rendered(tmp_path, "draft_target")
    _edit(repo / "tensorrt_llm" / "config.pbtxt", 'key: "enable_kv_cache_reuse"\n    value: { string_value: "True" }',
          'key: "enable_kv_cache_reuse"\n    value: { string_value: "False" }')
    with pytest.raises(RenderError, match="draft-target needs enable_kv_cache_reuse True on the target"):
        validate_repository(repo)


@pytest.mark.parametrize("edit,message", [
    (('key: "enable_kv_cache_reuse"\n    value: { string_value: "True" }',
      'key: "enable_kv_cache_reuse"\n    value: { string_value: "False" }'), "needs enable_kv_cache_reuse True"),
    (("decoupled: false", "decoupled: true"), "needs decoupled false"),
], ids=["kv-reuse", "decoupled"])
def test_validator_ngram_bls_target_rules(tmp_path, edit, message):
    repo = _rendered(tmp_path, "ngram_bls")
    _edit(repo / "tensorrt_llm" / "config.pbtxt", *edit)
    with pytest.raises(RenderError, match=f"n-gram through the BLS {message}"):
        validate_repository(repo)


def test_ngram_bls_parameters_only_in_the_speculative_bls(tmp_path):
    cfg = make_cfg("reference", "ngram_bls", workdir=tmp_path)
    write_manifest(cfg)
    results = render(cfg)
    spec = parse_config_file(results["speculative"][0] / "tensorrt_llm_bls" / "config.pbtxt").parameters
    assert {k: spec[k].string_value for k in spec if k.startswith("ngram_") or k == "speculative_method"} == {
        "speculative_method": "ngram", "ngram_max_draft_len": "4", "ngram_max_matching_ngram_size": "3",
        "ngram_min_matching_ngram_size": "1", "ngram_is_keep_all": "true", "ngram_is_use_oldest": "true"}
    assert spec["tensorrt_llm_draft_model_name"].string_value == ""
    base = parse_config_file(results["baseline"][0] / "tensorrt_llm_bls" / "config.pbtxt").parameters
    assert "speculative_method" not in base


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_rerender_replaces_atomically(tmp_path):
    repo = _rendered(tmp_path)
    (repo / "stray.txt").write_text("old")
    cfg = make_cfg("reference", "medusa", workdir=tmp_path)
    render(cfg)
    assert not (repo / "stray.txt").exists()
    assert sorted(p.name for p in repo.parent.iterdir()) == [  # no temporary left; each swap's lock file stays
        ".baseline.swap.lock", ".speculative.swap.lock", *(
            f"{variant}{suffix}" for variant in ("baseline", "speculative")
            for suffix in ("", ".alerts.yml", ".dashboard.json", ".render.json"))]


def test_cli_render(tmp_path, capsys):
    import yaml

    from pipeline.cli import run

    data = {"name": "cli-dt", "backend": "reference", "hardware": "cpu", "target": {"checkpoint": "/models/target"},
            "speculation": METHODS["draft_target"],
            "build": {"max_batch_size": 4, "max_input_len": 128, "max_seq_len": 256}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(data))
    cfg = parse_config(data, workdir=tmp_path)
    write_manifest(cfg)
    assert run(["render", str(tmp_path / "c.yaml"), "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "load tests call tensorrt_llm_bls num_draft_tokens=4" in out
    assert (tmp_path / "engines" / "cli-dt" / "model_repo" / "speculative" / "tensorrt_llm_draft" / "config.pbtxt").is_file()


_IMPORT_PROBE = """
import importlib.util, os, subprocess, sys, types
fake = types.ModuleType("triton_python_backend_utils")
fake.TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
sys.modules["triton_python_backend_utils"] = fake
sys.path.append(sys.argv[2])  # numpy and tokenizers, without the .pth files that find the checkout
spec = importlib.util.spec_from_file_location("model", sys.argv[1])
spec.loader.exec_module(importlib.util.module_from_spec(spec))
print(sys.modules["pipeline"].__file__)
if sys.argv[3] != "worker":  # a model that starts no engine worker: no child to probe
    sys.exit(0)
try:  # the engine worker's start, up to running its module (models that start none lack it)
    from pipeline.reference.worker import _BOOT
    start = _BOOT.rsplit("\\n", 1)[0] + "\\nimport pipeline; print(pipeline.__file__)"
except ImportError:
    start = "import pipeline; print(pipeline.__file__)"
child = subprocess.run([sys.executable, "-c", start], capture_output=True, text=True)
print(child.stdout.strip())
"""


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_rendered_python_models_import_their_own_copy(tmp_path):
    """Run from the checkout's directory (where `pipeline` would otherwise be found), a rendered
    model.py imports the copy next to it, and so does the engine worker process it starts."""
    import subprocess
    import sys
    import sysconfig

    repo = _rendered(tmp_path, "draft_target").resolve()
    site = sysconfig.get_paths()["purelib"]
    for model in ("preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_draft", "tensorrt_llm_bls"):
        model_py = repo / model / "1" / "model.py"
        # the engine worker's child is started (a second interpreter) only where it is checked
        worker = model.startswith("tensorrt_llm") and model != "tensorrt_llm_bls"
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONSAFEPATH")}
        out = subprocess.run([sys.executable, "-S", "-c", _IMPORT_PROBE, str(model_py), site,
                              "worker" if worker else "-"], cwd=PROJECT_ROOT,
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        own, child = (out.stdout.split("\n") + [""])[:2]
        assert own == str((repo / model / "1" / "_specdeploy" / "pipeline" / "__init__.py").resolve())
        if worker:  # starts the engine worker
            assert child == own


def _trtllm_repo_params(tmp_path, method="medusa", variant="speculative", **triton) -> dict:
    cfg = make_cfg("trtllm", method, **triton, workdir=tmp_path)
    write_manifest(cfg)
    repo = render(cfg)[variant][0]
    config = parse_config_file(repo / "tensorrt_llm" / "config.pbtxt")
    return {k: v.string_value for k, v in config.parameters.items()}


@pytest.mark.slow  # over the quick tier's CPU budget (tests/conftest.py)
def test_runtime_knobs_are_rendered(tmp_path):
    params = _trtllm_repo_params(tmp_path, enable_chunked_context=True, max_attention_window_size=200,
                                 max_tokens_in_paged_kv_cache=1024)
    assert params["enable_chunked_context"] == "True"
    assert params["max_attention_window_size"] == "200"
    assert params["max_tokens_in_paged_kv_cache"] == "1024"
    (tmp_path / "d").mkdir()
    defaults = _trtllm_repo_params(tmp_path / "d")
    assert defaults["enable_chunked_context"] == "False" and defaults["max_attention_window_size"] == ""


def _engine_dir(path: Path, mode, paged_fmha: bool = True) -> str:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"build_config": {
        "speculative_decoding_mode": mode, "plugin_config": {"use_paged_context_fmha": paged_fmha}}}))
    return str(path)


def test_engine_speculative_mode_is_read_as_trtllm_writes_it(tmp_path):
    """TensorRT-LLM's config.json holds the mode as an integer bit flag (medusa = 4)."""
    cfg = make_cfg("trtllm", "medusa", workdir=tmp_path)
    manifest = write_manifest(cfg)
    manifest["engines"] = {"baseline": _engine_dir(tmp_path / "e" / "b", 1), "speculative": _engine_dir(tmp_path / "e" / "s", 4)}
    assert render_repository(cfg, manifest, "speculative", tmp_path / "repo") == []
    manifest["engines"]["speculative"] = _engine_dir(tmp_path / "e" / "s2", 32)  # an EAGLE engine
    with pytest.raises(RenderError, match="decoding_mode 'medusa' but the engine was built for 'eagle'"):
        render_repository(cfg, manifest, "speculative", tmp_path / "repo2")


def test_chunked_context_needs_an_engine_with_paged_context_fmha(tmp_path):
    cfg = make_cfg("trtllm", "none", enable_chunked_context=True, workdir=tmp_path)
    manifest = write_manifest(cfg)
    manifest["engines"] = {"baseline": _engine_dir(tmp_path / "e" / "b", 1, paged_fmha=False)}
    with pytest.raises(RenderError, match="enable_chunked_context needs an engine built with paged context FMHA"):
        render_repository(cfg, manifest, "baseline", tmp_path / "repo")
    manifest["engines"] = {"baseline": _engine_dir(tmp_path / "e" / "ok", 1)}
    assert render_repository(cfg, manifest, "baseline", tmp_path / "repo") == []


def test_render_stamp_records_the_arm_placement(tmp_path):
    from pipeline.render.renderer import rendered_placement

    cfg = make_cfg("trtllm", "draft_target", workdir=tmp_path)
    write_manifest(cfg)
    render(cfg)
    spec = rendered_placement(cfg, "speculative")
    assert spec["strategy"] == "shared" and spec["launch"] == "orchestrator" and spec["gpus"] == [0]
    assert [(m["model_name"], m["gpus"]) for m in spec["models"]] == [("tensorrt_llm", [0]), ("tensorrt_llm_draft", [0])]
    base = rendered_placement(cfg, "baseline")
    assert base["launch"] == "single" and base["cuda_visible_devices"] == "0"
    assert base["kv_tokens"] == spec["kv_tokens"] == 4 * (256 + 4)  # equal, and the full batch fits
