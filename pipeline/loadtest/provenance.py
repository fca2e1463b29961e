"""Provenance of a load-test run: what ``run.json`` records beside the results.

Reads the checkout's SHA and installed package versions (:mod:`pipeline.infra.provenance`), the host, the config and the
build manifest (tokenizer directory); writes nothing (the runner writes ``run.json``).
"""

from __future__ import annotations

import json
import os
import platform
import sys
from datetime import datetime
from typing import Any

from pipeline.config import DeploymentConfig, config_hash
from pipeline.infra.provenance import git_sha, versions
from pipeline.loadtest import reach
from pipeline.loadtest.inputs import primary_draft_len
from pipeline.paths import manifest_path

LOADTEST_DISTS = ("specdeploy", "locust", "tritonclient", "nvidia-pytriton", "scipy", "numpy", "torch", "gevent",
                  "grpcio")


def host_hardware(cfg: DeploymentConfig) -> dict[str, Any]:
    import psutil  # noqa: PLC0415 - start-up: psutil (loaded when the host is described)

    return {"declared": cfg.hardware, "backend": cfg.backend, "client_host": platform.node(),
            "cpu_count": os.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform()}


def draft_model_name(cfg: DeploymentConfig) -> str | None:
    spec = cfg.speculation
    return getattr(getattr(spec, "draft", None), "checkpoint", None) or getattr(spec, "heads_dir", None) or getattr(spec, "head_dir", None)


def served_tokenizer_dir(cfg: DeploymentConfig) -> str | None:
    path = manifest_path(cfg)
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text()).get("tokenizer_dir")
    except (OSError, json.JSONDecodeError):
        return None


def run_metadata(cfg: DeploymentConfig, run_id: str, created: datetime, dataset: dict, sweep: list[int],
                 concurrency: list[int], duration_s: float, warmup_s: float, repeats: int,
                 tokenizer_dir: str | None) -> dict[str, Any]:
    """The content of ``run.json`` before any endpoint or command is known."""
    lt = cfg.loadtest
    return {
        "run_id": run_id, "name": cfg.name, "created": created.isoformat(),
        "config": reach.redacted(cfg.model_dump(mode="json")), "config_hash": config_hash(cfg), "git_sha": git_sha(),
        "versions": versions(LOADTEST_DISTS), "hardware": host_hardware(cfg), "dataset": dataset,
        "seeds": {"prompt_order": lt.seed, "sampling": lt.sampling.seed, "bootstrap": cfg.gate.bootstrap_seed},
        "method": cfg.method, "draft_model": draft_model_name(cfg), "primary_draft_len": primary_draft_len(cfg) if not sweep
        else (primary_draft_len(cfg) if primary_draft_len(cfg) in sweep else sweep[0]),
        "sweep_draft_len": sweep, "transport": lt.transport, "mode": lt.mode, "concurrency": concurrency,
        "duration_s": duration_s, "warmup_s": warmup_s, "repeats": repeats, "tokenizer_dir": tokenizer_dir,
        "endpoints": {}, "commands": [" ".join(sys.argv)],
    }
