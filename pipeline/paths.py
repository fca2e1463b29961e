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


def served_repository_problem(repo: Path) -> str | None:
    """Why Triton's Python backend cannot serve a model repository at ``repo``; None when it can.

    The checkpoint paths inside a repository may hold any character (the models re-encode them:
    ``pipeline.triton_models.fs_paths``), but the repository's own path reaches the stub before
    any of our code runs: with a space in it the stub is launched with its arguments split and
    aborts (``std::invalid_argument: stol``) while the server waits for the model forever, and with
    a non-ASCII character the stub's ASCII-only interpreter cannot load ``model.py``
    (UnicodeEncodeError). Observed with the nvidia-pytriton wheel's Triton 2.51 (docs/operations.md)."""
    text = str(Path(repo).absolute())
    if text.isascii() and not any(c.isspace() for c in text):
        return None
    return (f"the model repository {text} has a space or a non-ASCII character in its path, which "
            "Triton's Python backend cannot load models from; choose an output root with a plain ASCII "
            "path without spaces (--workdir); checkpoints may stay where they are")
