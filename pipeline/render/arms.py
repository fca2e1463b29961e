"""What each arm of a deployment is: ``render``'s decision, the one place it is derived from a config.

Reads the config (and, when rendering, the build manifest's tokenizer/version/stamp and the arm's
GPU placement); writes nothing: ``render`` writes the result beside each repository as the arm's
deployment descriptor (:class:`pipeline.artefacts.deployment.ArmDeployment`), and every stage after
render reads that file (:func:`pipeline.artefacts.deployment.load_arm`) instead of deciding again.
The decision is called outside ``render`` only where nothing was rendered on this machine: the
preflight's dry run of the later stages (before render), and a load test of servers started on
another host from a repository rendered there (``--endpoint-*`` with no descriptor here).
"""

from __future__ import annotations

from pipeline.artefacts.deployment import SCHEDULED, ArmDeployment, Drafts, check_arm
from pipeline.artefacts.schedule import SpeculationSchedule
from pipeline.config import DeploymentConfig, config_hash


def decide_arm(cfg: DeploymentConfig, arm: str, manifest: dict | None = None,
               placement: dict | None = None, schedule: SpeculationSchedule | None = None,
               schedule_path: str | None = None) -> ArmDeployment:
    """What ``arm`` of ``cfg`` is. draft_target or ngram orchestrated by the BLS: both arms call the
    BLS (the speculative arm adds num_draft_tokens = K); on the llmapi layout (the LLM-API runtime, or
    the CPU engine behind it) both call the llmapi ``tensorrt_llm`` model; every other case calls the
    ensemble. The scheduled arm (``schedule``, from ``render --schedule``) is the speculative arm
    whose engine runs the schedule's K per live batch size."""
    check_arm(cfg, arm)
    llm_api = getattr(cfg, "llmapi_layout", False)  # the llmapi model takes text in and out itself (GPU or CPU engine)
    bls = _bls_orchestrated(cfg)
    drafting = arm in (SPECULATIVE, SCHEDULED)
    extra = {"num_draft_tokens": _bls_draft_len(cfg)} if bls and drafting else {}
    speculative = drafting and cfg.speculative
    manifest = manifest or {}
    return ArmDeployment(
        arm=arm, name=cfg.name, config_hash=config_hash(cfg), backend=cfg.backend, method=cfg.method,
        model_name="tensorrt_llm_bls" if bls else ("tensorrt_llm" if llm_api else "ensemble"),
        contract="bls" if bls else ("llmapi" if llm_api else "ensemble"), extra_inputs=extra, transports=["grpc", "http"],
        decoupled=cfg.triton.decoupled, drafts=_drafts(cfg, arm), per_request_draft_len=bls and arm == "speculative",
        num_draft_tokens=_default_draft_len(cfg, bls) if speculative else None,
        # the method's own draft capacity (0: none, recorded as no limit)
        max_draft_len=(cfg.method_info.engine_max_draft_len(cfg.speculation) or None) if speculative else None,
        engine_models=2 if bls and cfg.method_info.draft_model else 1, tokenizer_dir=manifest.get("tokenizer_dir"),
        trtllm_version=manifest.get("trtllm_version"), manifest_created=manifest.get("created"), placement=placement,
        draft_len_schedule=[r.model_dump(include={"min_concurrency", "max_concurrency", "draft_len"})
                            for r in schedule.ranges] if arm == SCHEDULED and schedule else None,
        schedule_path=schedule_path if arm == SCHEDULED else None,
    )


SPECULATIVE = "speculative"


def _drafts(cfg: DeploymentConfig, arm: str) -> Drafts:
    if arm == "baseline" or not cfg.speculative:
        return "none"
    if _bls_orchestrated(cfg):
        return "bls"  # the llmapi model drafts inside its executor (GPU) or its engine (CPU)
    return "engine"


def _bls_orchestrated(cfg: DeploymentConfig) -> bool:
    """tensorrt_llm_bls runs the rounds: draft-target (orchestration bls) on the engine runtime, or
    n-gram with orchestration bls (drafts looked up in the BLS, verified as external drafts)."""
    if getattr(cfg, "llmapi_layout", False):
        return False
    return cfg.method_info.bls_orchestrated(cfg.speculation)


def _bls_draft_len(cfg: DeploymentConfig) -> int:
    """num_draft_tokens the speculative arm sends the BLS (draft-target: K; n-gram: its max_draft_len)."""
    return cfg.method_info.primary_draft_len(cfg.speculation)


def _default_draft_len(cfg: DeploymentConfig, bls: bool) -> int | None:
    return _bls_draft_len(cfg) if bls else getattr(cfg.speculation, "num_draft_tokens", None)
