"""Triton's load-time rules for a rendered repository, the ones its protobuf parser does not check.

Reads each ``config.pbtxt`` of a repository (parsed into ``ModelConfig`` through tritonclient's
generated protobuf) and the engine descriptors they point at; writes nothing. Checks names, version
dirs, ensemble wiring and dtypes, batch sizes, decoding mode vs engine, draft-target KV reuse and
decoupled consistency, so a broken template fails in ``render``, never in the server.
:class:`RenderError` is the error ``render`` raises for any of them.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

from pipeline.errors import SpecdeployError
from pipeline.methods import METHODS
from pipeline.trtllm.engine_config import SPEC_MODE_BITS


class RenderError(SpecdeployError):
    """A template or a rendered config is broken; names the file and the reason."""

    def __init__(self, problems: list[str], *, exit_code: int | None = None):
        self.problems = problems
        super().__init__("; ".join(problems), exit_code=exit_code)

    def lines(self) -> list[str]:
        return [f"render failed: {len(self.problems)} problem(s)"] + [f"  {p}" for p in self.problems]


# ----------------------------------------------------------------------------------------------
# Validation (Triton's load-time rules the protobuf parser does not check)


def parse_config_file(path: Path):
    from google.protobuf import text_format  # noqa: PLC0415 - start-up: google.protobuf (loaded when a config.pbtxt is parsed; pipeline.serve.command imports this module)
    from tritonclient.grpc import model_config_pb2  # noqa: PLC0415 - start-up: tritonclient (its model_config_pb2; loaded when a config.pbtxt is parsed)

    config = model_config_pb2.ModelConfig()
    try:
        config.ParseFromString(_parsed(path.read_text()))
    except text_format.ParseError as exc:
        raise RenderError([f"{path}: does not parse as a Triton ModelConfig: {exc}"]) from None
    return config


@functools.lru_cache(maxsize=256)
def _parsed(text: str) -> bytes:
    """``text`` parsed as a ModelConfig, serialised. protobuf's text parser is pure Python and was
    about half of every render; most of a repository's configs come out the same text render after
    render (the pre/post-processing and ensemble models), so each distinct text is parsed once per
    process and its binary form, which protobuf's C parser reads back, is kept (a text that does
    not parse raises, and is not kept)."""
    from google.protobuf import text_format  # noqa: PLC0415 - start-up: google.protobuf (loaded when a config.pbtxt is parsed; pipeline.serve.command imports this module)
    from tritonclient.grpc import model_config_pb2  # noqa: PLC0415 - start-up: tritonclient (its model_config_pb2; loaded when a config.pbtxt is parsed)

    config = model_config_pb2.ModelConfig()
    text_format.Parse(text, config)
    return config.SerializeToString()


def config_param(config, key: str) -> str:
    return config.parameters[key].string_value if key in config.parameters else ""


def validate_repository(repo: Path, backend: str | None = None) -> list[str]:
    """Check a rendered repository; raise RenderError listing every problem, return warnings."""
    repo = Path(repo)
    problems: list[str] = []
    warnings: list[str] = []
    configs = {}
    for config_path in sorted(repo.glob("*/config.pbtxt")):
        config = parse_config_file(config_path)
        model_dir = config_path.parent
        configs[model_dir.name] = config
        if config.name != model_dir.name:
            problems.append(f"{config_path}: name {config.name!r} differs from its directory {model_dir.name!r}")
        if not (model_dir / "1").is_dir():
            problems.append(f"{model_dir}: version directory 1/ is missing")
        if config.backend == "python" and not (model_dir / "1" / "model.py").is_file():
            problems.append(f"{model_dir}: python backend without 1/model.py")
        if config.max_batch_size <= 0:
            problems.append(f"{config_path}: max_batch_size must be > 0")
    if not configs:
        raise RenderError([f"{repo}: no */config.pbtxt found"])
    for name, config in configs.items():
        if config.platform == "ensemble":
            _check_ensemble(repo, name, config, configs, problems, warnings)
    _check_llm_rules(repo, configs, problems, backend)
    if problems:
        raise RenderError(problems)
    return warnings


def _check_ensemble(repo, name, config, configs, problems, warnings) -> None:
    where = f"{repo / name / 'config.pbtxt'}"
    if len(config.instance_group):
        problems.append(f"{where}: an ensemble may not declare instance_group")
    ens_inputs = {t.name: t for t in config.input}
    seen_outputs: dict[str, object] = {}
    for t in config.output:
        if t.name in seen_outputs:
            warnings.append(f"{where}: output {t.name!r} is declared more than once (Triton tolerates it)")
        seen_outputs[t.name] = t
    produced: dict[str, tuple[str, int]] = {}  # tensor → (step model, dtype)
    for step in config.ensemble_scheduling.step:
        step_cfg = configs.get(step.model_name)
        if step_cfg is None:
            problems.append(f"{where}: step model {step.model_name!r} is not in the repository")
            continue
        if step_cfg.max_batch_size < config.max_batch_size:
            problems.append(
                f"{where}: ensemble max_batch_size {config.max_batch_size} exceeds "
                f"{step.model_name}'s {step_cfg.max_batch_size}"
            )
        outputs = {t.name: t for t in step_cfg.output}
        for key, tensor in step.output_map.items():
            if key not in outputs:
                problems.append(f"{where}: step {step.model_name} maps unknown output {key!r}")
                continue
            if tensor in produced:
                problems.append(f"{where}: tensor {tensor!r} is produced by both {produced[tensor][0]} and {step.model_name}")
            produced[tensor] = (step.model_name, outputs[key].data_type)
    for step in config.ensemble_scheduling.step:
        step_cfg = configs.get(step.model_name)
        if step_cfg is None:
            continue
        inputs = {t.name: t for t in step_cfg.input}
        for key, tensor in step.input_map.items():
            if key not in inputs:
                problems.append(f"{where}: step {step.model_name} maps unknown input {key!r}")
                continue
            if tensor in ens_inputs:
                source_dtype = ens_inputs[tensor].data_type
                if ens_inputs[tensor].optional and not inputs[key].optional:
                    problems.append(f"{where}: optional ensemble input {tensor!r} feeds required {step.model_name}.{key}")
            elif tensor in produced:
                source_dtype = produced[tensor][1]
            else:
                problems.append(f"{where}: {step.model_name}.{key} reads {tensor!r}, which no input or step provides")
                continue
            if source_dtype != inputs[key].data_type:
                problems.append(f"{where}: dtype mismatch on {tensor!r} → {step.model_name}.{key}")
        for key, tensor in inputs.items():
            if not tensor.optional and key not in step.input_map:
                problems.append(f"{where}: required input {step.model_name}.{key} is not mapped")
    for out_name, tensor in seen_outputs.items():
        if out_name not in produced:
            problems.append(f"{where}: ensemble output {out_name!r} is produced by no step")
        elif produced[out_name][1] != tensor.data_type:
            problems.append(f"{where}: dtype mismatch on ensemble output {out_name!r}")


def _reference_descriptor(engine_dir: str) -> dict | None:
    """A reference engine's ``engine.json``, or None for any other engine directory."""
    descriptor = Path(engine_dir) / "engine.json"
    return json.loads(descriptor.read_text()) if descriptor.is_file() else None


# tensorrt_llm decoding_mode → the method served with it (every method whose engine has its own mode)
_DECODING_MODES = {m.triton_decoding_mode: m for m in METHODS.values() if m.triton_decoding_mode}


def _method_of_mode(mode: str | None) -> str:
    """The method an engine built with ``--speculative_decoding_mode mode`` serves (the first that
    names it: draft_tokens_external is draft-target's, n-gram through the BLS reuses it)."""
    return next((m.name for m in METHODS.values() if m.engine_mode == mode), "none")


def _mode_of_method(name: str | None) -> str:
    method = METHODS.get(name or "")
    return method.triton_decoding_mode if method is not None else ""


def _engine_method(engine_dir: str, backend: str | None) -> str | None:
    """The speculation method an engine was built for, when its files say so."""
    path = Path(engine_dir)
    data = _reference_descriptor(engine_dir)
    if data is not None:
        return data.get("proposer", {}).get("method", "none") if data.get("role") != "target" else "draft_target"
    config = path / "config.json"
    if config.is_file():
        # TensorRT-LLM writes the mode as an integer bit flag (SpeculativeDecodingMode); names pass too
        raw = json.loads(config.read_text()).get("build_config", {}).get("speculative_decoding_mode")
        if raw in (None, "") or isinstance(raw, bool):
            return None
        names = {bit: name for name, bit in SPEC_MODE_BITS.items()}
        mode = names.get(raw) if isinstance(raw, int) else str(raw).lower().removeprefix("speculativedecodingmode.")
        return _method_of_mode(mode)
    return None


def _engine_drafts_itself(engine_dir: str) -> bool:
    """A reference engine that verifies external drafts and also drafts with its own draft model."""
    data = _reference_descriptor(engine_dir) or {}
    return data.get("role") == "speculative" and data.get("proposer", {}).get("method") == "draft_target"


def _check_llm_rules(repo, configs, problems, backend) -> None:
    bls = configs.get("tensorrt_llm_bls")
    target_name = config_param(bls, "tensorrt_llm_model_name") if bls else "tensorrt_llm"
    draft_name = config_param(bls, "tensorrt_llm_draft_model_name") if bls else ""
    for name in ("tensorrt_llm", "tensorrt_llm_draft"):
        config = configs.get(name)
        if config is None:
            continue
        where = repo / name / "config.pbtxt"
        mode = config_param(config, "decoding_mode")
        engine_method = _engine_method(config_param(config, "gpt_model_path"), backend)
        served = _DECODING_MODES.get(mode)  # the method whose decoding_mode this is
        engine_mode = _DECODING_MODES.get(_mode_of_method(engine_method))
        if served is not None and engine_method not in (None, served.name):
            problems.append(f"{where}: decoding_mode {mode!r} but the engine was built for {engine_method!r}")
        if not mode and engine_mode is not None:
            problems.append(f"{where}: the engine was built for {engine_method!r} but decoding_mode is unset")
        for parameter in served.required_triton_parameters if served is not None else ():
            if not config_param(config, parameter):
                problems.append(f"{where}: decoding_mode {mode} needs {parameter}")
    if bls is None:
        return
    bls_where = repo / "tensorrt_llm_bls" / "config.pbtxt"
    target = configs.get(target_name)
    if target is None:
        problems.append(f"{bls_where}: tensorrt_llm_model_name {target_name!r} is not in the repository")
        return
    if draft_name:
        draft = configs.get(draft_name)
        if draft is None:
            problems.append(f"{bls_where}: tensorrt_llm_draft_model_name {draft_name!r} is not in the repository")
            return
        if config_param(target, "enable_kv_cache_reuse").lower() not in ("true", "1"):
            problems.append(f"{repo / target_name / 'config.pbtxt'}: draft-target needs enable_kv_cache_reuse True on the target")
        for name, config in ((target_name, target), (draft_name, draft)):
            if name == target_name and _engine_drafts_itself(config_param(config, "gpt_model_path")):
                continue  # our BLS calls it with exec(decoupled=True) when it is decoupled
            if config.model_transaction_policy.decoupled:
                problems.append(f"{repo / name / 'config.pbtxt'}: draft-target needs decoupled false (the BLS calls it with exec(decoupled=False))")
    elif config_param(bls, "speculative_method") == "ngram":
        _check_ngram_bls_target(repo / target_name / "config.pbtxt", target, problems)
    elif target.model_transaction_policy.decoupled != bls.model_transaction_policy.decoupled:
        problems.append(
            f"{bls_where}: decoupled ({bls.model_transaction_policy.decoupled}) differs from "
            f"{target_name} ({target.model_transaction_policy.decoupled})"
        )


def _check_ngram_bls_target(where: Path, target, problems: list[str]) -> None:
    """The n-gram BLS calls its target each round as draft-target's BLS does (exec(decoupled=False),
    the whole context re-sent), so the same two settings apply."""
    if config_param(target, "enable_kv_cache_reuse").lower() not in ("true", "1"):
        problems.append(f"{where}: n-gram through the BLS needs enable_kv_cache_reuse True on the target")
    if target.model_transaction_policy.decoupled:
        problems.append(f"{where}: n-gram through the BLS needs decoupled false (the BLS calls it with exec(decoupled=False))")
