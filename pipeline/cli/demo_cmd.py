"""`specdeploy demo`: train or inspect the built-in demo models (tokenizer, target, draft, Medusa, EAGLE).

``demo train`` runs the deterministic CPU recipe (``pipeline.demo.train``) into a
directory (default: the first-use cache) and writes ``SHA256SUMS.txt`` + ``training_report.json``;
``--smoke`` runs a few dozen steps per model (CI proves the path end to end with it).
``demo info`` lists each builtin: where it resolves, its size, parameter count, weight sha256 and
whether the recorded hash matches. ``demo prompts`` rewrites ``prompts/tiny``
(deterministic). Torch is imported only by ``train``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from pipeline.errors import SpecdeployError, UsageError
from pipeline.validate.weight_integrity import read_safetensors_header


def _param_count(weights: Path) -> int:
    """Parameters in a safetensors file, from its JSON header (no torch import; the one header
    reader, validate's)."""
    return sum(math.prod(shape) for shape in read_safetensors_header(weights).shapes().values())


def _info_rows() -> list[dict]:
    from pipeline import demo

    rows = []
    for name in demo.BUILTIN_NAMES:
        root = demo.ARTIFACTS_DIR if (demo.ARTIFACTS_DIR / name).is_dir() else demo.cache_dir()
        model_dir = root / name
        weights = model_dir / demo.WEIGHT_FILES[name]
        row = {"name": f"builtin:{name}", "path": str(model_dir), "source": "shipped" if root == demo.ARTIFACTS_DIR else "cache"}
        if not weights.is_file():
            row.update(status="missing (trained on first use)")
            rows.append(row)
            continue
        row["size_bytes"] = sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file())
        row["params"] = _param_count(weights)
        row["sha256"] = demo.read_sums(root).get(f"{name}/{weights.name}", "")
        try:
            demo.verify_artifact(name, root)
            row["status"] = "ok (sha256 verified)"
        except SpecdeployError as exc:
            row["status"] = f"CORRUPTED: {exc}"
        rows.append(row)
    return rows


def register(app: typer.Typer) -> None:
    demo_app = typer.Typer(
        help="Train or inspect the built-in demo models (tokenizer, target, draft, Medusa, EAGLE).",
        no_args_is_help=True,
    )

    @demo_app.command("train", help="Train the demo models deterministically on CPU (one torch thread).")
    def train_command(
        out: Optional[Path] = typer.Option(None, "--out", help="Output directory (default: the demo cache)."),
        smoke: bool = typer.Option(False, "--smoke", help="A few dozen steps per model (CI): same formats, poor quality."),
        only: Optional[str] = typer.Option(None, "--only", help="Train one model (tiny-target, tiny-draft, tiny-medusa, tiny-eagle, tiny-eagle3)."),
        quiet: bool = typer.Option(False, "--quiet", help="No progress bars."),
    ) -> None:
        from pipeline import demo

        only_name = None if only is None else only.removeprefix("builtin:")
        if only_name is not None and only_name not in demo.BUILTIN_NAMES:
            raise UsageError(f"--only: unknown demo model '{only}'; choose one of {', '.join(demo.BUILTIN_NAMES)}")
        target_dir = (out or demo.cache_dir()).resolve()
        from pipeline.demo import train

        train.default_threads_env()
        report = train.train_all(target_dir, train.SMOKE if smoke else train.FULL, only=only_name, show_progress=not quiet)
        _print_summary(target_dir, report)

    @demo_app.command("info", help="List the built-in demo models: path, size, parameters, sha256, status.")
    def info_command(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
        rows = _info_rows()
        if as_json:
            typer.echo(json.dumps(rows, indent=2))
            return
        for row in rows:
            typer.echo(f"{row['name']}  [{row['source']}]  {row['status']}")
            typer.echo(f"  path    {row['path']}")
            if "params" in row:
                typer.echo(f"  params  {row['params']:,}   size {row['size_bytes'] / 1e6:.1f} MB")
                typer.echo(f"  sha256  {row['sha256']}")

    @demo_app.command("prompts", help="Regenerate the demo prompt sets (held-out prefixes, one file per category).")
    def prompts_command(
        out: Path = typer.Option(Path("prompts/tiny"), "--out", help="Directory for <category>.jsonl."),
        count: int = typer.Option(60, "--count", min=1, help="Prompts per category."),
    ) -> None:
        from pipeline.demo.prompt_sets import write_tiny_prompt_sets

        for path in write_tiny_prompt_sets(out, count):
            typer.echo(f"wrote {path}")

    app.add_typer(demo_app, name="demo")


def _print_summary(out_dir: Path, report: dict) -> None:
    quality = report.get("quality", {})
    typer.echo(f"trained into {out_dir} in {report['total_seconds']} s (per stage: {report['seconds']})")
    for key in ("target_heldout_loss", "draft_top1_agreement", "eagle_one_step_agreement"):
        if key in quality:
            value = quality[key]
            typer.echo(f"  {key}: {value.get('in_domain', value) if isinstance(value, dict) and 'in_domain' in value else value}")
    heads = [quality[k]["in_domain"] for k in sorted(quality) if k.startswith("medusa_head")]
    if heads:
        typer.echo(f"  medusa per-head agreement: {heads}")
    typer.echo(f"  hashes: {out_dir / 'SHA256SUMS.txt'}; report: {out_dir / 'training_report.json'}")
