"""The deployment descriptor, one file per arm next to its repository:
``engines/NAME/model_repo/<arm>.render.json``. ``render`` decides what each arm is and writes it
here; ``serve`` (is the repository current, where does it run, how many engine models share the
CPUs) and ``loadtest`` (which model to call with which extra inputs, whether a request may carry
its own draft length, the placement) read it instead of asking ``render`` again. A repository
rendered before this file had a schema is refused with "re-run `specdeploy render`".

This module is the file's schema and its reader; the decision it records is ``render``'s
(:func:`pipeline.render.arms.decide_arm`), made once per render. :func:`load_arm` (the repository and
its descriptor, for a server started here) and :func:`load_descriptor` (the descriptor alone, for a
server started elsewhere from this repository) refuse a missing or stale file and name the stage to
run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field

from pipeline.artefacts.base import Artefact
from pipeline.config import config_hash
from pipeline.errors import StaleInputError, UsageError
from pipeline.paths import model_repo_dir

if TYPE_CHECKING:
    from pipeline.config import DeploymentConfig

ARMS = ("baseline", "speculative")
# The third arm: the speculative engine running a speculation schedule (K per live batch size), rendered
# by `render --schedule FILE` only; a load test measures it beside the A/B arms (docs/schedule.md).
SCHEDULED = "scheduled"
ALL_ARMS = (*ARMS, SCHEDULED)
Drafts = Literal["none", "engine", "bls"]
# The tensors a client sends and reads: the inflight_batcher_llm ensemble's (text_input, max_tokens,
# stream, ... → text_output, num_output_tokens, perf outputs), the BLS's (the ensemble's plus
# num_draft_tokens), or the TensorRT-LLM llmapi model's (text_input, sampling_param_*, streaming →
# text_output, cumulative while streaming; docs/gpu-llmapi.md).
Contract = Literal["ensemble", "bls", "llmapi"]


class ArmDeployment(Artefact):
    """One arm of a rendered deployment: what to call and what the server behind it does."""

    SCHEMA = "specdeploy-deployment/1"
    VERSION = 1
    FILE = "engines/NAME/model_repo/<arm>.render.json"
    WRITER = "specdeploy render"

    arm: Literal["baseline", "speculative", "scheduled"]
    name: str = Field(description="The deployment (config `name`).")
    config_hash: str = Field(description="Hash of the config the repository was rendered from.")
    backend: Literal["reference", "trtllm"]
    method: str = Field(description="The config's speculation.method (its list of methods is the only one).")
    model_name: str = Field(description="The Triton model a client of this arm calls (ensemble or tensorrt_llm_bls).")
    contract: Contract = Field("ensemble", description="The tensor contract of model_name: ensemble, bls "
                                                         "(ensemble plus num_draft_tokens) or llmapi.")
    extra_inputs: dict[str, int] = Field(default_factory=dict,
                                         description="Inputs every request to this arm adds (num_draft_tokens for the BLS).")
    transports: list[Literal["grpc", "http"]] = Field(description="Protocols the arm's server answers on.")
    decoupled: bool = Field(description="The models stream (decoupled transaction policy).")
    drafts: Drafts = Field(description="Where drafts come from: none (baseline), the engine itself, or the BLS "
                                       "calling a draft model per step.")
    per_request_draft_len: bool = Field(description="A request may set num_draft_tokens (BLS orchestration only).")
    num_draft_tokens: int | None = Field(None, description="Draft tokens per step the arm uses by default.")
    max_draft_len: int | None = Field(None, description="The engine's draft limit (tree node count for trees).")
    engine_models: int = Field(description="Engine models of the arm with the most (BLS draft-target: draft + "
                                           "target); both arms' CPU pinning follows it.")
    tokenizer_dir: str | None = Field(None, description="The tokenizer the repository's models load.")
    trtllm_version: str | None = Field(None, description="TensorRT-LLM version the engines were built with.")
    manifest_created: str | None = Field(None, description="When the build manifest this was rendered from was written.")
    placement: dict[str, Any] | None = Field(None, description="Where the arm runs (pipeline.plan.gpu_layout summary).")
    draft_len_schedule: list[dict[str, Any]] | None = Field(None, description=(
        "The scheduled arm: the schedule's ranges (min_concurrency, max_concurrency, draft_len) its engine runs."))
    schedule_path: str | None = Field(None, description="The scheduled arm: the schedule.json it was rendered from.")


def arms_of(cfg: "DeploymentConfig") -> tuple[str, ...]:
    return ARMS if cfg.speculative else ("baseline",)


def check_arm(cfg: "DeploymentConfig", arm: str) -> None:
    """``arm`` exists for ``cfg``: the scheduled arm wherever there is a speculative one (whether it was
    rendered, `render --schedule`, is the repository's question: :func:`load_arm`)."""
    if arm == SCHEDULED and cfg.speculative:
        return
    if arm not in arms_of(cfg):
        raise UsageError(
            f"variant {arm!r} does not exist for speculation method {cfg.method!r} "
            f"(choose from: {', '.join(arms_of(cfg))})"
        )


def descriptor_path(repo: Path) -> Path:
    """``<repo>.render.json``: the descriptor beside the arm's repository."""
    return repo.with_name(f"{repo.name}.render.json")


def load_descriptor(cfg: "DeploymentConfig", arm: str) -> ArmDeployment:
    """The descriptor ``render`` wrote for ``arm``; refused when it is missing, predates its schema, or
    was rendered from another config (the repository itself may be served on another host)."""

    check_arm(cfg, arm)
    path = descriptor_path(model_repo_dir(cfg, arm))
    if not path.is_file():
        raise StaleInputError(f"no deployment descriptor at {path}: run `specdeploy render` first")
    descriptor = ArmDeployment.load(path)
    if descriptor.config_hash != config_hash(cfg):
        raise StaleInputError(f"{path} was rendered from another config: re-run `specdeploy render` "
                              "(and `specdeploy build` if the engines changed)")
    return descriptor


def load_arm(cfg: "DeploymentConfig", arm: str) -> tuple[Path, ArmDeployment]:
    """(repository, descriptor) of ``arm`` as ``render`` left it; refused when either is missing,
    the descriptor predates its schema, or it was rendered from another config."""

    check_arm(cfg, arm)
    repo = model_repo_dir(cfg, arm)
    if not (repo / "tensorrt_llm" / "config.pbtxt").is_file() or not descriptor_path(repo).is_file():
        how = "`specdeploy render --schedule RUN_DIR/schedule.json`" if arm == SCHEDULED else "`specdeploy render`"
        raise StaleInputError(f"no rendered repository at {repo}: run {how} first")
    return repo, load_descriptor(cfg, arm)
