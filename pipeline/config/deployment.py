"""The whole deployment config: :class:`DeploymentConfig` puts the sections together with the
speculation method's section (one per method in the registry :data:`pipeline.methods.METHODS`,
chosen by its ``method`` field) and checks the rules that cross sections.

The config sits above the methods: it reads their sections from the registry, so a new method
changes nothing here, and the method modules import only the building blocks
(:mod:`pipeline.config_base`), never this package.

Reads and writes nothing; :mod:`pipeline.config.loading` reads the YAML.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Union, get_args

from pydantic import Field, PrivateAttr, field_validator, model_validator

from pipeline.config.sections import (
    BuildLimits,
    CapacitySettings,
    GateSettings,
    LlmApiSettings,
    LoadTestSettings,
    ReferenceEngineSettings,
    TritonSettings,
)
from pipeline.config_base import (
    ENGINE_RUNTIME_MAX_VERSION,
    TRTLLM_VERSION_DEFAULT,
    CrossFieldError,
    ModelSpec,
    Section,
    TrtllmRuntime,
    described,
)
from pipeline.facts.hardware import PROFILES
from pipeline.methods import METHODS, Method

# One config section per method, in the registry's order (the one the schema and the errors list).
METHOD_SECTIONS = tuple(method.section for method in METHODS.values())
METHOD_NAMES = tuple(get_args(section.model_fields["method"].annotation)[0] for section in METHOD_SECTIONS)

Speculation = Annotated[Union[METHOD_SECTIONS], Field(discriminator="method")]


class DeploymentConfig(Section):
    """One deployment: target, speculation method, hardware, build, Triton, load test and gate."""

    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")] = described(
        "Deployment name; outputs go to engines/NAME/ and reports/NAME/."
    )
    description: str = described("Free text shown in reports.", default="")
    backend: Literal["trtllm", "reference"] = described(
        "trtllm (GPU engines) or reference (CPU PyTorch engine, hardware 'cpu').", default="trtllm"
    )
    hardware: str = described(
        "Hardware profile: h100-sxm-80gb, h100-pcie-80gb, h200-141gb, a100-80gb, a100-40gb, "
        "l40s-48gb, b200-180gb or cpu.",
        default="h100-sxm-80gb",
    )
    trtllm_version: str = described(
        "TensorRT-LLM version the engines are built and served with (engine path: ≤ 1.2.x).",
        default=TRTLLM_VERSION_DEFAULT,
    )
    trtllm_runtime: TrtllmRuntime | None = described(
        "TensorRT-LLM runtime: engine (trtllm-build engines behind the C++ tensorrtllm backend, "
        "≤ 1.2.x) or llm_api (HF/ModelOpt checkpoints run by the LLM API: the Triton llmapi model or "
        "trtllm-serve, 1.2.x and later). Unset: engine up to 1.2.x, llm_api past it. With backend "
        "reference, llm_api serves the CPU engine behind the same llmapi repository layout "
        "(methods none, draft_target, ngram; docs/reference-engine.md).",
        default=None,
    )
    trtllm_root: str | None = described(
        "Directory holding TensorRT-LLM's examples/ (quantize.py, convert_checkpoint.py): the NGC "
        "1.2.x image's /app or a v1.2.1 checkout. --trtllm-root overrides it; unset: $SPECDEPLOY_TRTLLM_ROOT, "
        "then /app when /app/examples exists (see docs/gpu-runbook.md).",
        default=None,
    )
    target: ModelSpec = described("The target model.")
    speculation: Speculation = described(
        "Speculation method: none | draft_target | medusa | eagle | lookahead (engine runtime) | eagle3 | ngram | "
        "mtp (LLM-API runtime), with per-method fields (pipeline/methods/).",
        default_factory=METHODS["none"].section,  # no speculation: the baseline alone
    )
    build: BuildLimits = described("Engine build limits.", default_factory=BuildLimits)
    triton: TritonSettings = described("Triton settings.", default_factory=TritonSettings)
    llm_api: LlmApiSettings = described("LLM-API runtime settings (trtllm_runtime: llm_api).",
                                    default_factory=LlmApiSettings)
    reference: ReferenceEngineSettings = described(
        "CPU reference engine settings.", default_factory=ReferenceEngineSettings
    )
    loadtest: LoadTestSettings = described("Load-test settings.", default_factory=LoadTestSettings)
    gate: GateSettings = described("Rollout gate thresholds.", default_factory=GateSettings)
    capacity: CapacitySettings | None = described(
        "Capacity and cost at gate.slo in the report (docs/capacity.md); unset: no capacity section.", default=None)
    _source_path: Path | None = PrivateAttr(default=None)
    _workdir: Path | None = PrivateAttr(default=None)  # output root (pipeline.paths); None: the current directory

    @field_validator("trtllm_version")
    @classmethod
    def _version_shape(cls, value: str) -> str:
        parts = value.split(".")
        if len(parts) < 2 or not all(p.isdigit() for p in parts[:2]):
            raise ValueError(f"'{value}' is not a TensorRT-LLM version like '1.2.1'")
        return value

    @field_validator("hardware")
    @classmethod
    def _known_hardware(cls, value: str) -> str:

        if value not in PROFILES:
            raise ValueError(f"unknown hardware profile '{value}'; valid: {', '.join(PROFILES)}")
        return value

    @model_validator(mode="after")
    def _cross_section_rules(self) -> "DeploymentConfig":
        method = self.method_info
        problems: list[tuple[str, str]] = []
        if self.loadtest.sweep_draft_len and not method.per_request_draft_len:
            problems.append(("loadtest.sweep_draft_len", "only draft_target sends num_draft_tokens per request"))
        problems += method.config_problems(self)
        if self.loadtest.mode == "closed":
            missing = [c for c in self.gate.target_concurrency if c not in self.loadtest.concurrency]
            if missing:
                problems.append(
                    (
                        "gate.target_concurrency",
                        f"{missing} are not load-test concurrency levels {self.loadtest.concurrency}",
                    )
                )
        if problems:
            raise CrossFieldError(problems)
        return self

    @model_validator(mode="after")
    def _serving_knob_rules(self) -> "DeploymentConfig":
        """Runtime knobs of the tensorrt_llm model that depend on the engine limits or the method."""
        t, problems = self.triton, []
        if t.max_attention_window_size is not None and t.max_attention_window_size > self.build.max_seq_len:
            problems.append(("triton.max_attention_window_size",
                             f"{t.max_attention_window_size} exceeds build.max_seq_len ({self.build.max_seq_len})"))
        if t.max_tokens_in_paged_kv_cache is not None and t.max_tokens_in_paged_kv_cache < self.build.max_seq_len:
            problems.append(("triton.max_tokens_in_paged_kv_cache",
                             f"{t.max_tokens_in_paged_kv_cache} tokens cannot hold one sequence of "
                             f"build.max_seq_len ({self.build.max_seq_len})"))
        if problems:
            raise CrossFieldError(problems)
        return self

    @property
    def method(self) -> str:
        return self.speculation.method

    @property
    def method_info(self) -> Method:
        """The speculation method's deployment knowledge (:mod:`pipeline.methods`)."""
        return METHODS[self.speculation.method]

    @property
    def speculative(self) -> bool:
        """The deployment has a speculative arm (every method but ``none``)."""
        return self.method_info.speculative

    @property
    def trtllm_version_tuple(self) -> tuple[int, ...]:
        return tuple(int(p) for p in self.trtllm_version.split(".") if p.isdigit())

    @property
    def runtime(self) -> str:
        """``trtllm_runtime`` as set, else engine up to 1.2.x and llm_api past it."""
        if self.trtllm_runtime is not None:
            return self.trtllm_runtime
        return "llm_api" if self.trtllm_version_tuple[:2] > ENGINE_RUNTIME_MAX_VERSION else "engine"

    @property
    def runs_llm_api(self) -> bool:
        """TensorRT-LLM's LLM API runs the deployment (GPU: no engine compile, ModelOpt checkpoints)."""
        return self.backend == "trtllm" and self.runtime == "llm_api"

    @property
    def llmapi_layout(self) -> bool:
        """The arms are Triton ``llmapi`` repositories (one ``tensorrt_llm`` model, text in and out,
        ``model.yaml``): TensorRT-LLM's LLM API on GPU, or the CPU reference engine behind the same
        layout when ``backend: reference`` sets ``trtllm_runtime: llm_api`` explicitly."""
        if self.backend == "reference":
            return self.trtllm_runtime == "llm_api"
        return self.runs_llm_api

    @property
    def draft(self) -> ModelSpec | None:
        return self.speculation.draft if self.method_info.draft_model else None

    @property
    def source_path(self) -> Path | None:
        """The file this config was loaded from (relative paths in it resolve beside it); None when
        it was built in memory."""
        return self._source_path

    def set_source_path(self, path: Path | None) -> None:
        """Record the file this config came from (``load_config``, the endpoints-only load test)."""
        self._source_path = path

    @property
    def workdir(self) -> Path | None:
        """Where ``engines/`` and ``reports/`` go (``--workdir``); None: the current directory."""
        return self._workdir
