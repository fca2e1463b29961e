"""Deployment configuration: the YAML a platform engineer writes once, as pydantic v2 models.

Three parts here and the building blocks beneath, every public name importable from here:

- :mod:`pipeline.config_base`: the building blocks (strict sections, described fields, cross-field
  errors, quantization, one model, tree choices), outside this package so that the method modules,
  whose sections build on them, import no part of the config;
- :mod:`pipeline.config.sections`: build limits, Triton, LLM-API knobs, load test, gate, CPU engine;
- :mod:`pipeline.config.deployment`: :class:`DeploymentConfig`, with the speculation method's own
  section from the methods' registry (:data:`pipeline.methods.METHODS`; a method's section is
  imported from its module, ``pipeline.methods.<name>``);
- :mod:`pipeline.config.loading`: strict YAML loading, error formatting, the config hash.

Cross-field *logic* that needs no files lives in the sections and the method modules; checks that
read checkpoints or depend on the GPU architecture live in ``pipeline.validate``. The field
descriptions feed ``specdeploy schema``. Reads and writes nothing itself.
"""

from __future__ import annotations

from pipeline.config.deployment import (
    METHOD_NAMES,
    METHOD_SECTIONS,
    DeploymentConfig,
    Speculation,
)
from pipeline.config.loading import (
    LOADING_RULES_MARKDOWN,
    DuplicateKeyError,
    StrictLoader,
    config_hash,
    format_validation_error,
    load_config,
    load_yaml_strict,
    parse_config,
    with_workdir,
)
from pipeline.config.sections import (
    BuildLimits,
    GateSettings,
    LlmApiSettings,
    LoadTestSettings,
    ReferenceEngineSettings,
    Sampling,
    Slo,
    TritonSettings,
)
from pipeline.config_base import (
    BUILTIN_PREFIX,
    ENGINE_RUNTIME_MAX_VERSION,
    TRTLLM_VERSION_DEFAULT,
    CrossFieldError,
    KvCacheDtype,
    ModelDtype,
    ModelSpec,
    QuantFormat,
    Quantization,
    TreeChoices,
    TrtllmRuntime,
    chain_choices,
    format_choices,
    tree_depth,
    tree_non_leaves_per_level,
    tree_problems,
)

__all__ = [
    "BUILTIN_PREFIX", "ENGINE_RUNTIME_MAX_VERSION", "LOADING_RULES_MARKDOWN", "METHOD_NAMES", "METHOD_SECTIONS",
    "TRTLLM_VERSION_DEFAULT", "BuildLimits", "CrossFieldError", "DeploymentConfig",
    "DuplicateKeyError", "GateSettings", "KvCacheDtype", "LlmApiSettings",
    "LoadTestSettings", "ModelDtype", "ModelSpec",
    "QuantFormat", "Quantization", "ReferenceEngineSettings", "Sampling", "Slo", "Speculation",
    "StrictLoader", "TreeChoices", "TritonSettings", "TrtllmRuntime", "chain_choices", "config_hash",
    "format_choices", "format_validation_error", "load_config", "load_yaml_strict",
    "parse_config", "tree_depth", "tree_non_leaves_per_level", "tree_problems", "with_workdir",
]
