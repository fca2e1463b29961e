"""Where each stage reads and writes, derived from the config name under the config's output
root (``--workdir`` / ``load_config(..., workdir=)``; by default relative to the current
directory, the project root in every README example): ``engines/<name>/`` for build outputs and
the rendered model repository, ``reports/<name>/<run>/`` for load tests and reports."""

from __future__ import annotations

from pathlib import Path

from pipeline.config import DeploymentConfig

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def output_root(cfg: DeploymentConfig) -> Path:
    """The config's ``--workdir``; ``Path()`` (the current directory) when none was given."""
    return cfg.workdir or Path()


def engine_root(cfg: DeploymentConfig) -> Path:
    return output_root(cfg) / "engines" / cfg.name


def manifest_path(cfg: DeploymentConfig) -> Path:
    return engine_root(cfg) / "manifest.json"


def logs_dir(cfg: DeploymentConfig) -> Path:
    return engine_root(cfg) / "logs"


def model_repo_dir(cfg: DeploymentConfig, variant: str) -> Path:
    return engine_root(cfg) / "model_repo" / variant


def reports_root(cfg: DeploymentConfig) -> Path:
    return output_root(cfg) / "reports" / cfg.name
