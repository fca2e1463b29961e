"""The checkpoints the config names, as this host has them: one row per directory (target, draft,
heads), from the very checks ``validate`` runs (:mod:`pipeline.validate.checkpoints` — files in the
formats the route reads, weight files whole and of the architecture the deployment loads, shapes,
vocabulary, tokenizers, heads) rather than a second copy of them.

Reads the findings of :func:`pipeline.validate.preflight.run_preflight` and, for the found column,
each directory's ``config.json`` (architecture, hidden size, layers, vocabulary) and which tokenizer
file it ships. Writes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.config import DeploymentConfig
from pipeline.validate.findings import ERROR, Finding, spec_checkpoints
from pipeline.validate.live.result import LiveCheck, failed, passed, skipped

CHECKPOINT_CHECKS = frozenset({"files", "weights", "tokenizer", "heads"})


def role_of(finding: Finding, roles: list[str]) -> str | None:
    """The checkpoint a finding is about, from its field path."""
    where = finding.field or ""
    if where.startswith("target"):
        return "target"
    if where.startswith("speculation.draft") or (finding.check == "tokenizer" and "draft" in roles):
        return "draft"
    if where.startswith("speculation"):
        return next((r for r in roles if r not in ("target", "draft")), None)
    return None


def identity(directory: Path) -> str:
    """``LlamaForCausalLM, hidden 4096, 32 layers, vocab 128256; tokenizer.json`` from the files."""
    parts = []
    try:
        data = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        data = {}
    if isinstance(data, dict) and data:
        arch = (data.get("architectures") or ["architecture unnamed"])[0]
        parts.append(", ".join([str(arch)] + [f"{label} {data[key]}" for key, label in
                                              (("hidden_size", "hidden"), ("num_hidden_layers", "layers"),
                                               ("vocab_size", "vocab")) if key in data]))
    tokenizer = [name for name in ("tokenizer.json", "tokenizer.model") if (directory / name).is_file()]
    parts.append(" + ".join(tokenizer) if tokenizer else "no tokenizer file")
    return "; ".join(parts)


def check_checkpoints(cfg: DeploymentConfig, findings: list[Finding]) -> list[LiveCheck]:
    items = spec_checkpoints(cfg)
    roles = [role for role, _, _ in items]
    out = []
    for role, path, checkpoint in items:
        name = f"checkpoint {role}"
        expected = (f"{checkpoint}: the files, architecture, shapes, vocabulary and tokenizer that {cfg.method} on "
                    f"the {cfg.runtime} runtime reads")
        source = f"config {path} (validate's checkpoint checks)"
        mine = [f for f in findings if f.check in CHECKPOINT_CHECKS and role_of(f, roles) == role]
        errors = [f for f in mine if f.severity == ERROR]
        notes = [f.message for f in mine if f.severity != ERROR]
        if errors:
            out.append(failed(name, expected, source, "; ".join(f.message for f in errors),
                              "; ".join(dict.fromkeys(f.fix for f in errors if f.fix)) or "fix the checkpoint"))
            continue
        directory = Path(checkpoint).expanduser()
        if checkpoint.startswith("builtin:") or not directory.is_dir():
            out.append(skipped(name, expected, source, "not checked: "
                               + ("; ".join(notes) or f"{checkpoint} is not a directory on this host")))
            continue
        found = f"{directory}: {identity(directory)}" + (f" (validate notes: {'; '.join(notes)})" if notes else "")
        out.append(passed(name, expected, source, found))
    return out
