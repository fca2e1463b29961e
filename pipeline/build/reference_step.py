"""Build steps of the reference (CPU) backend, run by ``specdeploy build`` as
``python -m pipeline.build.reference_step <resolve|quantize|engine> …``.

- ``resolve``: find a checkpoint (``--builtin NAME`` via ``pipeline.demo.resolve_builtin``,
  or ``--local DIR``), check it holds the files its ``--kind`` needs, and create ``--out`` as a
  symlink to it, so later steps name a fixed path.
- ``quantize``: ``pipeline.reference.quantize.quantize_checkpoint(--src, --dst, --format)``.
- ``engine``: write ``--out/engine.json``, the engine descriptor
  (:class:`pipeline.artefacts.engine.EngineDescriptor`, absolute paths); every flag's default is
  the descriptor field's default.

Each step writes only its ``--out``/``--dst`` (the build runner points it at a temporary path and
renames it into place). A problem is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing
from pathlib import Path

from pydantic import ValidationError

from pipeline.artefacts import engine as spec
from pipeline.artefacts.base import problem_lines
from pipeline.artefacts.engine import ENGINE_DESCRIPTOR, EngineDescriptor
from pipeline.errors import SpecdeployError
from pipeline.methods import method_for_proposer

REQUIRED_FILES = {
    "llama": [("config.json",), ("model.safetensors", "model.safetensors.index.json")],
    "medusa": [("config.json",), ("medusa_lm_head.safetensors",)],
    "eagle": [("config.json",), ("model.safetensors",)],
}
NGRAM_FLAGS = ("is_keep_all", "is_use_oldest", "is_public_pool")  # n-gram pool switches (true/false)


class StepError(Exception):
    pass


def check_checkpoint(path: Path, kind: str) -> None:
    if not path.is_dir():
        raise StepError(f"{kind} checkpoint {path} is not a directory")
    for alternatives in REQUIRED_FILES[kind]:
        if not any((path / name).is_file() for name in alternatives):
            raise StepError(f"{kind} checkpoint {path} lacks {' or '.join(alternatives)}")


def cmd_resolve(args: argparse.Namespace) -> None:
    if args.builtin:
        from pipeline.demo import resolve_builtin  # noqa: PLC0415 - may import torch

        source = Path(resolve_builtin(args.builtin))
    else:
        source = Path(args.local)
    source = source.resolve()
    check_checkpoint(source, args.kind)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    os.symlink(source, out, target_is_directory=True)
    print(f"resolved {args.builtin or args.local} -> {source}")


def cmd_quantize(args: argparse.Namespace) -> None:
    from pipeline.reference.quantize import quantize_checkpoint  # noqa: PLC0415 - imports torch

    src = Path(args.src).resolve()
    check_checkpoint(src, "llama")
    quantize_checkpoint(src, Path(args.dst), args.format)
    print(f"quantized {src} ({args.format}) -> {args.dst}")


def _proposer(args: argparse.Namespace) -> dict:
    found = _method_spec(args)
    method = method_for_proposer(found["method"])
    if args.draft_weights == "int8" and (method.draft_model or method.head_field):  # checkpoint-free methods have no draft weights
        found["draft_int8"] = True  # the engine quantizes the draft-side weights at load
    return found


def _method_spec(args: argparse.Namespace) -> dict:
    if args.proposer_fields:  # a method without checkpoints gives its proposer's fields as they are
        return {"method": args.method, **json.loads(args.proposer_fields)}
    from_flags = _PROPOSER_FROM_FLAGS.get(args.method)
    return from_flags(args) if from_flags else {"method": args.method}  # checkpoint-free: the descriptor's defaults


def _draft_target(args: argparse.Namespace) -> dict:
    draft = Path(args.draft_dir).resolve()
    check_checkpoint(draft, "llama")
    return _given({"method": "draft_target", "draft_dir": str(draft), "quantization": args.draft_quantization,
                   "num_draft_tokens": args.num_draft_tokens})


def _ngram(args: argparse.Namespace) -> dict:
    return _given({"method": "ngram", "max_draft_len": args.num_draft_tokens,
                   "max_matching_ngram_size": args.max_matching_ngram_size,
                   "min_matching_ngram_size": args.min_matching_ngram_size,
                   **{knob: getattr(args, knob) == "true" for knob in NGRAM_FLAGS}})


def _eagle3(args: argparse.Namespace) -> dict:
    head = Path(args.head_dir).resolve()
    check_checkpoint(head, "eagle")
    return _given({"method": "eagle3", "head_dir": str(head), "max_draft_len": args.num_draft_tokens})


def _medusa(args: argparse.Namespace) -> dict:
    heads = Path(args.heads_dir).resolve()
    check_checkpoint(heads, "medusa")
    return _given({"method": "medusa", "heads_dir": str(heads), "num_heads": args.num_heads,
                   "choices": json.loads(args.choices)})


def _eagle(args: argparse.Namespace) -> dict:
    head = Path(args.head_dir).resolve()
    check_checkpoint(head, "eagle")
    return _given({"method": "eagle", "head_dir": str(head), "num_layers": args.num_layers,
                   "choices": json.loads(args.choices)})


# proposer name → its engine.json fields from this step's flags (the planner writes those flags)
_PROPOSER_FROM_FLAGS = {"none": lambda args: {"method": "none"}, "draft_target": _draft_target, "ngram": _ngram,
                        "eagle3": _eagle3, "medusa": _medusa, "eagle": _eagle}


def _given(fields: dict) -> dict:
    """The flags given (a flag left out takes the descriptor's default)."""
    return {k: v for k, v in fields.items() if v is not None}


def cmd_engine(args: argparse.Namespace) -> None:
    model_dir = Path(args.model_dir).resolve()
    check_checkpoint(model_dir, "llama")
    try:
        descriptor = EngineDescriptor(
            role=args.role, model_dir=str(model_dir), quantization=args.quantization, proposer=_proposer(args),
            max_draft_len=args.max_draft_len, max_batch_size=args.max_batch_size, max_seq_len=args.max_seq_len,
            max_input_len=args.max_input_len, compute_dtype=args.compute_dtype, threads=args.threads,
            prefix_cache_entries=args.prefix_cache_entries, fast_paths=args.fast_paths,
            config_hash=args.config_hash or None,  # the manifest records the deployment's hash
            name=args.name,
        )
    except ValidationError as exc:
        raise StepError("engine descriptor: " + "; ".join(problem_lines(exc))) from None
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    descriptor.write(out / ENGINE_DESCRIPTOR)
    print(f"wrote {out / ENGINE_DESCRIPTOR} ({args.role})")


def _engine_flags(engine: argparse.ArgumentParser) -> None:
    """The ``engine`` step's flags; choices and defaults come from the descriptor model."""
    fields = spec.EngineDescriptor.model_fields
    quantizations = list(typing.get_args(spec.Quantization))
    engine.add_argument("--out", required=True)
    engine.add_argument("--role", choices=list(typing.get_args(spec.Role)), required=True)
    engine.add_argument("--model-dir", required=True)
    engine.add_argument("--quantization", choices=quantizations, default=spec.default("quantization"))
    proposers = typing.get_args(typing.get_args(spec.ProposerSpec)[0])
    methods = [typing.get_args(model.model_fields["method"].annotation)[0] for model in proposers]
    engine.add_argument("--method", choices=methods, default="none")
    engine.add_argument("--draft-dir")
    engine.add_argument("--draft-quantization", choices=quantizations,
                        default=spec.proposer_default(spec.DraftTargetProposer, "quantization"))
    engine.add_argument("--num-draft-tokens", type=int)
    engine.add_argument("--heads-dir")
    engine.add_argument("--num-heads", type=int)
    engine.add_argument("--head-dir")
    engine.add_argument("--num-layers", type=int)
    engine.add_argument("--choices", default="[]")
    for knob in ("max_matching_ngram_size", "min_matching_ngram_size"):
        engine.add_argument(f"--{knob.replace('_', '-')}", type=int, default=spec.proposer_default(spec.NgramProposer, knob))
    for knob in NGRAM_FLAGS:
        default = "true" if spec.proposer_default(spec.NgramProposer, knob) else "false"
        engine.add_argument(f"--{knob.replace('_', '-')}", choices=["true", "false"], default=default)
    engine.add_argument("--proposer-fields", default="", help="JSON of the proposer's fields (checkpoint-free methods)")
    engine.add_argument("--draft-weights", choices=["float", "int8"], default="float")
    engine.add_argument("--max-draft-len", type=int, default=spec.default("max_draft_len"))
    engine.add_argument("--max-batch-size", type=int, required=True)
    engine.add_argument("--max-seq-len", type=int, required=True)
    engine.add_argument("--max-input-len", type=int, required=True)
    engine.add_argument("--compute-dtype", choices=list(typing.get_args(fields["compute_dtype"].annotation)),
                        default=spec.default("compute_dtype"))
    engine.add_argument("--threads", type=int, default=spec.default("threads"))
    engine.add_argument("--prefix-cache-entries", type=int, default=spec.default("prefix_cache_entries"))
    engine.add_argument("--fast-paths", action=argparse.BooleanOptionalAction, default=spec.default("fast_paths"))
    engine.add_argument("--name", default=spec.default("name"))
    engine.add_argument("--config-hash", default="")
    engine.set_defaults(func=cmd_engine)


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m pipeline.build.reference_step", description=__doc__.split("\n\n")[0])
    sub = top.add_subparsers(dest="command", required=True)

    resolve = sub.add_parser("resolve", help="find and check a checkpoint, link it at --out")
    where = resolve.add_mutually_exclusive_group(required=True)
    where.add_argument("--builtin")
    where.add_argument("--local")
    resolve.add_argument("--kind", choices=sorted(REQUIRED_FILES), default="llama")
    resolve.add_argument("--out", required=True)
    resolve.set_defaults(func=cmd_resolve)

    quantize = sub.add_parser("quantize", help="quantize a Llama checkpoint")
    quantize.add_argument("--src", required=True)
    quantize.add_argument("--dst", required=True)
    quantize.add_argument("--format", choices=["int8_wo"], default="int8_wo")
    quantize.set_defaults(func=cmd_quantize)

    _engine_flags(sub.add_parser("engine", help="write an engine.json descriptor"))
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        args.func(args)
    except (StepError, SpecdeployError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
