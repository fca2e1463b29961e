"""What a speculation method is to the deployment side: the :class:`Method` every
``pipeline/methods/<name>.py`` module subclasses once.

Reads and writes nothing. A method module holds its config section (a pydantic model whose
``method`` literal is the method's name) and one :class:`Method` object: the runtimes it runs on,
the reference proposer it maps to, its ``trtllm-build`` mode, its Triton ``decoding_mode`` and
parameters, its LLM-API ``decoding_type``, its validation rules and how the report names it. The
stages ask that object (``cfg.method_info``, :func:`pipeline.methods.get_method`) and never branch
on the method's name; ``tests/unit/methods/test_methods.py`` fails on a new ``method ==`` outside this
package.

Each hook takes the validated config section (``spec``) or the whole config; the defaults here
are those of a method that does none of it, so a module overrides only what it has. Imports stay
at the config's building blocks (:mod:`pipeline.config_base`), beneath the config, which reads
every method's section from the registry (:data:`pipeline.methods.METHODS`) to build
:class:`~pipeline.config.DeploymentConfig`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from pipeline.methods.drafting import DraftHead, DraftPlan

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from pydantic import BaseModel


# The hooks' argument types, by name only: pipeline.config.DeploymentConfig and validate's
# CheckContext. Importing them, even for type checking, would close a cycle: the config builds its
# ``speculation`` union from the registry of these modules, and validate.findings reads the config.
DeploymentConfig = Any
CheckContext = Any

ENGINE, LLM_API, REFERENCE = "engine", "llm_api", "reference"  # runtimes: trtllm-build engines, the LLM API, the CPU engine


@dataclass(frozen=True)
class Checkpoint:
    """A kind of checkpoint directory the CPU build step resolves and checks (``resolve --kind``)."""

    kind: str  # its name on the build step's command line and in its messages
    files: tuple[tuple[str, ...], ...]  # each entry: one of these files must be in the directory


# the HF Llama checkpoint every CPU engine loads (target, draft)
LLAMA = Checkpoint("llama", (("config.json",), ("model.safetensors", "model.safetensors.index.json")))


@dataclass(frozen=True)
class StepFlag:
    """One flag of the CPU build step ``engine`` (``python -m pipeline.build.reference_step``) that
    carries a field of the method's ``engine.json`` proposer; a method whose ``plan_reference``
    writes flags (rather than ``--proposer-fields``) lists them in ``Method.step_flags``. Methods
    may share a flag (``--head-dir``) if they give it the same type and default."""

    flag: str  # "--heads-dir"
    field: str  # the proposer field it fills ("heads_dir")
    type: str = "int"  # int, str, json (a JSON value), bool (true/false) or checkpoint (a directory)
    checkpoint: Checkpoint | None = None  # type checkpoint: what the directory must hold
    default: str | None = None  # None: left out of engine.json, which then takes the descriptor's default


class Method:
    """One speculation method's deployment knowledge. Class attributes are facts; methods are rules."""

    name: ClassVar[str]
    section: ClassVar[type[BaseModel]]  # the config section ``speculation:`` (its ``method`` literal is ``name``)
    title: ClassVar[str]  # how the report and the CLI name it
    speculative: ClassVar[bool] = True  # False: the baseline alone (no speculative arm)
    runtimes: ClassVar[frozenset[str]] = frozenset()  # where it runs: ENGINE, LLM_API, REFERENCE
    proposer: ClassVar[str | None] = None  # pipeline.reference.proposers registry name
    engine_mode: ClassVar[str | None] = None  # trtllm-build --speculative_decoding_mode of its engine
    engine_from_target: ClassVar[bool] = False  # that engine is the target's own checkpoint (no heads, no draft)
    triton_decoding_mode: ClassVar[str] = ""  # tensorrt_llm decoding_mode parameter ("" = upstream's default)
    required_triton_parameters: ClassVar[tuple[str, ...]] = ()  # tensorrt_llm parameters its decoding_mode needs
    llmapi_decoding_type: ClassVar[str | None] = None  # speculative_config.decoding_type on the LLM API
    vllm_method: ClassVar[str | None] = None  # vLLM's speculative_config.method (vllm/config/speculative.py; None: none)
    engine_only_decoding_type: ClassVar[str | None] = None  # upstream's decoding_type it would have had there
    engine_only_reason: ClassVar[str | None] = None  # why the LLM API refuses it (else the facts file says)
    draft_model: ClassVar[bool] = False  # a second (draft) model with its own checkpoint and engine
    per_request_draft_len: ClassVar[bool] = False  # a request may choose K (num_draft_tokens)
    head_field: ClassVar[str | None] = None  # the spec field naming a head/heads directory
    head_role: ClassVar[str | None] = None  # how validate names that directory
    min_engine_version: ClassVar[tuple[int, int] | None] = None  # oldest trtllm-build that has the mode
    step_flags: ClassVar[tuple[StepFlag, ...]] = ()  # the CPU build step's flags its plan_reference writes

    # -- draft lengths -------------------------------------------------------------------------
    def primary_draft_len(self, spec: Any) -> int | None:
        """Draft tokens per step the deployment is known by (None: not fixed by the config)."""
        return None

    def engine_max_draft_len(self, spec: Any) -> int:
        """The engine's draft capacity (``--max_draft_len``; 0: none)."""
        value = getattr(spec, "engine_max_draft_len", None)
        return value if value is not None else getattr(spec, "max_draft_len", 0) or 0

    def memory_draft_len(self, spec: Any) -> tuple[int, int]:
        """(extra KV positions per sequence, draft tokens per step) the memory estimate adds."""
        k = self.engine_max_draft_len(spec)
        return k, k

    def draft_head(self, spec: Any) -> DraftHead | None:
        """The head inside the target's engine that drafts (None: no head, or a separate draft model)."""
        return None

    # -- plan: the build route ------------------------------------------------------------------
    # ``p`` is the planner (pipeline.plan.planner._Planner): its ``source``, ``reference_*``,
    # ``trtllm_*``, ``checkpoint_expectation`` and ``add_step`` add the steps; the method names the
    # engines and the order (the plan goldens hold it).
    def plan_reference(self, p: Any, spec: Any, target: tuple[str, str]) -> None:
        """The CPU reference backend's engines after the target's model (``target``: dir, quantization):
        the baseline, then, for a checkpoint-free method, the speculative engine with its proposer's fields."""
        p.reference_baseline(target)
        if self.proposer:
            proposer = ["--method", self.proposer, "--proposer-fields",
                        json.dumps(self.proposer_fields(spec), separators=(",", ":"), sort_keys=True)]
            p.reference_engine("speculative", target, proposer, self.engine_max_draft_len(spec), [])

    def plan_trtllm(self, p: Any, spec: Any, v: Any, target_ckpt: str, tokenizer: str) -> None:
        """The engine runtime's checkpoints and engines after the target's checkpoint: the baseline, then,
        for a method built from the target's own checkpoint, that engine in the method's mode."""
        p.trtllm_baseline(v, target_ckpt)
        if self.engine_from_target:
            p.trtllm_engine(v, "speculative", target_ckpt, p.cfg.target, mode=self.engine_mode,
                            k=self.engine_max_draft_len(spec), logits=p.cfg.build.gather_generation_logits)

    def resends_context(self, spec: Any) -> bool:
        """The BLS re-sends the whole context every round (the engines' max_input_len is then max_seq_len − 1)."""
        return False

    # -- forecast ------------------------------------------------------------------------------
    def draft_plan(self, spec: Any) -> DraftPlan | None:
        """How deep it drafts and how wide the target verifies (None: nothing to forecast)."""
        return None

    def draft_seconds(self, ctx: Any, plan: DraftPlan) -> float:
        """Seconds one speculative step spends drafting for ``ctx.batch`` sequences (the forecast's
        ``StepContext``); 0: a host-side lookup or no proposer, free against a forward."""
        return 0.0

    # -- Triton orchestration ------------------------------------------------------------------
    def renders_bls(self, spec: Any) -> bool:
        """The repository's tensorrt_llm_bls orchestrates this method's rounds (engine runtime)."""
        return False

    def bls_orchestrated(self, spec: Any) -> bool:
        """Clients call tensorrt_llm_bls, which runs the rounds (else the ensemble or the llmapi model)."""
        return False

    def paged_fmha_needed_by(self, cfg: DeploymentConfig) -> str | None:
        """Why the method cannot run without paged context FMHA (None: it can)."""
        return None

    def triton_parameters(self, spec: Any) -> dict[str, str]:
        """tensorrt_llm parameters of the speculative engine model beyond ``decoding_mode``."""
        return {}

    # -- config and validate -------------------------------------------------------------------
    def config_problems(self, cfg: DeploymentConfig) -> list[tuple[str, str]]:
        """(field path, message) of cross-section rules that need no files (config load time)."""
        return []

    def check(self, ctx: CheckContext) -> None:
        """Preflight rules that need the whole picture (hardware, runtime, build limits)."""

    def check_shapes(self, ctx: CheckContext) -> None:
        """Preflight rules that need the models' shapes (``ctx.shapes``, ``ctx.dirs``)."""

    def check_head(self, ctx: CheckContext, head_cfg: dict, tensors: Callable[[], tuple[dict, Path] | None],
                   directory: Path) -> None:
        """Rules of the head directory (``head_field``) against its ``config.json`` (``head_cfg``) and,
        when a rule needs them, its tensors: ``tensors()`` reads (shapes, weights file), or None when
        validate already reported them missing or unreadable."""

    def head_weights(self, cfg: DeploymentConfig) -> tuple[str, tuple[str, ...], str]:
        """("weights", glob patterns of which one must match, why) for the head directory the build
        route of ``cfg.backend`` reads (beside its ``config.json``)."""
        raise NotImplementedError(f"{self.name} has no head directory")

    def quantizes_with_head(self, cfg: DeploymentConfig) -> bool:
        """The build quantizes target and head together (EAGLE's FP8 route: examples/eagle/quantize.py)."""
        return False

    def uses_draft_logits(self, spec: Any) -> bool:
        """Acceptance reads the draft's logits (fast logits; TensorRT-LLM ≥ 0.15)."""
        return False

    def check_llm_api(self, ctx: CheckContext, facts: Any) -> None:
        """Rules of the LLM-API runtime (and the CPU llmapi layout) against the release's recorded
        facts (:class:`pipeline.trtllm.llmapi_facts.VersionFacts`)."""

    def check_cpu_llmapi_layout(self, ctx: CheckContext) -> None:
        """Rules of the CPU engine behind the llmapi layout (``backend: reference``, ``trtllm_runtime: llm_api``)."""

    def check_engine_runtime(self, ctx: CheckContext) -> None:
        """Rules of the engine runtime for a method that runs there (``ENGINE in runtimes``)."""

    # -- LLM-API runtime -----------------------------------------------------------------------
    def speculative_config(self, cfg: DeploymentConfig, spec: Any, engines: dict[str, str]) -> dict[str, Any]:
        """Method fields of ``speculative_config`` (decoding_type is added by the caller)."""
        return {}

    def llmapi_draft_dir(self, spec: Any) -> str | None:
        """A checkpoint directory the LLM API loads as ``speculative_model`` as it is (no quantize step)."""
        return None

    # -- CPU reference engine ------------------------------------------------------------------
    def proposer_fields(self, spec: Any) -> dict[str, Any]:
        """``engine.json`` ``proposer`` fields (beside ``method``) but the checkpoint directories
        (``draft_dir``, ``head_field``), which the caller resolves."""
        return {}
