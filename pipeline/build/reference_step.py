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
from pipeline.demo import resolve_builtin
from pipeline.errors import SpecdeployError
from pipeline.methods import METHODS, method_for_proposer
from pipeline.methods.base import LLAMA, StepFlag

# the checkpoint kinds the steps check: the Llama models and each method's head directories
CHECKPOINTS = {c.kind: c for c in (LLAMA, *(f.checkpoint for m in METHODS.values() for f in m.step_flags if f.checkpoint))}
REQUIRED_FILES = {kind: list(c.files) for kind, c in CHECKPOINTS.items()}


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
    from pipeline.reference.quantize import quantize_checkpoint  # noqa: PLC0415 - start-up: torch (pipeline.reference.quantize; only an int8 build needs it)

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
    # the fields the method's plan_reference wrote as flags; a method with none (checkpoint-free) gets the
    # descriptor's defaults
    fields = {flag.field: _flag_value(flag, getattr(args, _dest(flag))) for flag in method_for_proposer(args.method).step_flags}
    return _given({"method": args.method, **fields})


def _flag_value(flag: StepFlag, raw: str | None):
    if raw is None:
        return None
    if flag.type == "checkpoint":
        path = Path(raw).resolve()
        check_checkpoint(path, flag.checkpoint.kind)
        return str(path)
    try:
        return {"int": int, "str": str, "json": json.loads, "bool": lambda v: v == "true"}[flag.type](raw)
    except ValueError as exc:
        raise StepError(f"{flag.flag} {raw!r}: not {'JSON' if flag.type == 'json' else 'an integer'} ({exc})") from None


def _dest(flag: StepFlag) -> str:
    return flag.flag.removeprefix("--").replace("-", "_")


def _method_flags(engine: argparse.ArgumentParser) -> None:
    """Each flag the methods' ``step_flags`` name, once (methods sharing one give it the same type and default)."""
    flags: dict[str, StepFlag] = {}
    for method in METHODS.values():
        for flag in method.step_flags:
            seen = flags.setdefault(flag.flag, flag)
            if (seen.type, seen.default) != (flag.type, flag.default):
                raise ValueError(f"{method.name} gives {flag.flag} another type or default than another method does")
    for flag in flags.values():
        if flag.type == "bool":
            engine.add_argument(flag.flag, choices=["true", "false"], default=flag.default)
        else:  # the value is parsed per method (_flag_value): int here, a JSON tree there
            engine.add_argument(flag.flag, default=flag.default)


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
    _method_flags(engine)
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
