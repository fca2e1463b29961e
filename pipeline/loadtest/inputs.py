"""What the load test reads and refuses before it starts anything: the prompt set and the draft-length sweep.

Reads the dataset (``loadtest.dataset_path`` or ``loadtest.prompts``, in the format
``loadtest.dataset_name`` names: :mod:`pipeline.loadtest.datasets`; lengths by
:mod:`pipeline.loadtest.lengths`), the config's speculation section and the arms' deployment
descriptors (as ``render`` wrote them: does the speculative arm take a draft length per request,
which contract does each arm serve); writes nothing.
:class:`LoadTestError` is the stage's error; :class:`PromptSetError` names the config field.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from pipeline.artefacts.deployment import ArmDeployment
from pipeline.config import DeploymentConfig
from pipeline.engine_bench import resolve_checkpoint
from pipeline.errors import EXIT_USAGE, SpecdeployError, UsageError
from pipeline.loadtest.datasets import DatasetError, DatasetOptions, dataset_format, load_rows
from pipeline.loadtest.lengths import TextCutter, apply_lengths, parse_length
from pipeline.paths import PROJECT_ROOT

ARMS = ("baseline", "speculative")


class LoadTestError(SpecdeployError):
    """The load test could not be set up or run: the load harness failed (exit 5)."""


class LoadTestUsageError(LoadTestError):
    """A load-test option or input that cannot work as given (exit 2): nothing was measured."""

    exit_code = EXIT_USAGE


# ------------------------------------------------------------------------------------------------
# Inputs


class PromptSetError(LoadTestError):
    """The prompt set cannot be used: ``field`` is the config field, ``detail`` what is wrong (exit 2)."""

    exit_code = EXIT_USAGE

    def __init__(self, field: str, detail: str, dataset_error: DatasetError | None = None):
        self.field, self.detail = field, detail
        self.dataset_error = dataset_error  # file, line and field of a malformed record
        super().__init__(f"{field}: {detail}")


def prompt_set_candidates(cfg: DeploymentConfig, written: str | None = None) -> list[Path]:
    """Where ``loadtest.prompts`` (or ``written``, e.g. ``dataset_path``) may be, in lookup order: as
    written when absolute; else under the working directory, the project root and the config file's directory."""
    base = Path(written if written is not None else cfg.loadtest.prompts)
    candidates = [base] if base.is_absolute() else [Path.cwd() / base, PROJECT_ROOT / base]
    if cfg.source_path is not None and not base.is_absolute():
        candidates.append(cfg.source_path.parent / base)
    return list(dict.fromkeys(candidates))


def _find(cfg: DeploymentConfig, written: str, field: str) -> Path:
    candidates = prompt_set_candidates(cfg, written)
    path = next((p for p in candidates if p.exists()), None)
    if path is None:
        looked = "" if Path(written).is_absolute() else (
            " (a relative path is looked up under the working directory, the project root and the config's "
            "directory: " + ", ".join(str(p) for p in candidates) + ")")
        raise PromptSetError(field, f"{written} does not exist{looked}")
    return path


def load_prompt_set(cfg: DeploymentConfig, tokenizer_dir: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The requests' data: rows of ``loadtest.dataset_path`` (else ``loadtest.prompts``) read as
    ``loadtest.dataset_name`` (:mod:`pipeline.loadtest.datasets`), filtered by ``categories``, drawn
    down (or up) to ``num_prompts``, cut to ``input_len`` and given their ``max_tokens`` from
    ``output_len`` (:mod:`pipeline.loadtest.lengths`, in ``tokenizer_dir``'s tokenizer or the
    target's). Returns the prompts and what ``run.json`` records about them (``dataset``)."""
    lt = cfg.loadtest
    fmt = dataset_format(lt.dataset_name)
    field = "loadtest.dataset_path" if lt.dataset_path else "loadtest.prompts"
    path = _find(cfg, lt.dataset_path or lt.prompts, field)
    if path.is_dir() and not fmt.directory:
        raise PromptSetError(field, f"{path} is a directory; dataset_name '{fmt.name}' reads one file")
    try:
        rows = load_rows(fmt.name, path, DatasetOptions(multi_turn=lt.multi_turn, prompt_column=lt.prompt_column,
                                                        category_column=lt.category_column))
    except DatasetError as exc:  # the config field beside the file, line and field in the file
        raise PromptSetError(field, str(exc), dataset_error=exc) from None
    files = _data_files(path, fmt.name)
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes())
    prompts = [_with_reference(r) for r in rows]
    if lt.categories:
        unknown = sorted(set(lt.categories) - {p["category"] for p in prompts})
        if unknown:
            raise PromptSetError("loadtest.categories", f"{unknown} not found in {path}")
        prompts = [p for p in prompts if p["category"] in lt.categories]
    if not prompts:
        raise PromptSetError(field, f"no prompts in {path}")
    category_texts: dict[str, list[str]] = {}
    for p in prompts:
        if p["prompt"].strip():
            category_texts.setdefault(p["category"], []).append(p["prompt"])
    corpus_texts = [p["prompt"] for p in prompts if p["prompt"].strip()]
    prompts = _draw_prompts(prompts, lt.num_prompts, lt.seed)
    if fmt.name == "mooncake_trace" and lt.dataset_path:  # a trace has no text: cut it from the prompt set's
        corpus_texts = [r.prompt for r in load_rows("specdeploy", _find(cfg, lt.prompts, "loadtest.prompts"))]
    try:
        lengths = apply_lengths(
            prompts, input_len=parse_length(lt.input_len, "loadtest.input_len") if lt.input_len else None,
            output_len=parse_length(lt.output_len, "loadtest.output_len") if lt.output_len else None,
            default_max_tokens=lt.max_tokens, seed=lt.seed,
            cutter_factory=_cutter_factory(cfg, tokenizer_dir, corpus_texts), category_texts=category_texts)
    except UsageError as exc:  # no tokenizer, or too little text for the lengths asked: validate names it too
        raise PromptSetError("loadtest.input_len", str(exc).removeprefix("--input-len: ")) from None
    dataset = {"path": str(path), "format": fmt.name, "files": [f.name for f in files], "n_prompts": len(prompts),
               "categories": sorted({p["category"] for p in prompts}), "sha256": digest.hexdigest(),
               "multi_turn": lt.multi_turn, "num_prompts": lt.num_prompts, "lengths": lengths,
               "ignore_eos": lt.ignore_eos, "trace": any("arrival_s" in p for p in prompts)}
    dataset["warnings"] = data_warnings(dataset)
    dataset["synthetic"] = bool(dataset["warnings"])
    return prompts, dataset


def _with_reference(row) -> dict[str, Any]:
    prompt = row.as_prompt()
    if row.reference_output:
        prompt["reference_output"] = row.reference_output  # its tokens: the dataset's own output length
    return prompt


def _data_files(path: Path, name: str) -> list[Path]:
    if path.is_file():
        return [path]
    if name == "specdeploy":
        return sorted(path.glob("*.jsonl"))
    return sorted(p for p in path.rglob("*") if p.is_file())


def _draw_prompts(prompts: list[dict[str, Any]], n: int | None, seed: int) -> list[dict[str, Any]]:
    """``n`` prompts, the same for both arms: a seeded sample without replacement, or every row
    repeated (copies get ``#k`` ids) when ``n`` exceeds them, as vLLM oversamples. A trace keeps its order."""
    if n is None or n == len(prompts):
        return prompts
    if any("arrival_s" in p for p in prompts):
        return [dict(p) for p in prompts[:n]] if n <= len(prompts) else prompts
    rng = random.Random(seed)
    if n < len(prompts):
        return [prompts[i] for i in sorted(rng.sample(range(len(prompts)), n))]
    out = [dict(p) for p in prompts]
    for k in range(n - len(prompts)):
        copy = dict(prompts[k % len(prompts)])
        copy["id"] = f"{copy['id']}#{k // len(prompts) + 1}"
        out.append(copy)
    return out


def _cutter_factory(cfg: DeploymentConfig, tokenizer_dir: str | None, corpus: list[str]):
    """The text cutter in the target's tokenizer: ``tokenizer_dir`` (the served one), else the
    target checkpoint's; None when neither has a ``tokenizer.json``."""

    def make():
        for directory in (tokenizer_dir, _target_tokenizer_dir(cfg)):
            if directory and (Path(directory) / "tokenizer.json").is_file():
                return TextCutter(Path(directory) / "tokenizer.json", corpus)
        return None

    return make


def _target_tokenizer_dir(cfg: DeploymentConfig) -> str | None:
    try:

        return str(resolve_checkpoint(cfg.target.checkpoint))
    except Exception:  # noqa: BLE001 - no target tokenizer: the caller says what is missing
        return None


def data_warnings(dataset: dict[str, Any]) -> list[str]:
    """What makes the run's acceptance unrepresentative of real traffic, from the data itself
    (the report shows each): forced output lengths, prompts cut or stitched to drawn lengths."""
    out = []
    lengths = dataset.get("lengths") or {}
    if dataset.get("ignore_eos"):
        out.append("forced output lengths (ignore_eos / min_tokens): every answer runs to its max_tokens past "
                   "where the model would stop, so acceptance and speedup are not those of real traffic "
                   "(ai-dynamo/dynamo#12918)")
    if lengths.get("cut_prompts"):
        extended = lengths.get("extended_prompts") or 0
        out.append(f"{lengths['cut_prompts']} prompts were cut from the dataset's text to drawn input lengths "
                   f"({lengths.get('input_len') or 'the trace'})" + (
                       f", {extended} of them continued with other prompts' text" if extended else "")
                   + ": real text, but not the requests users send")
    return out


# the flags of vLLM `bench serve` / AIPerf that set a loadtest field (docs/workload.md)
DATASET_FLAGS = {"dataset_name": "--dataset-name", "dataset_path": "--dataset-path", "num_prompts": "--num-prompts",
                 "input_len": "--input-len", "output_len": "--output-len", "ignore_eos": "--ignore-eos"}


def with_loadtest_overrides(cfg: DeploymentConfig, overrides: dict[str, Any] | None) -> DeploymentConfig:
    """``cfg`` with the dataset flags given on the command line over its ``loadtest`` fields,
    checked as the YAML would be; a usage error names the flag."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None and v is not False}
    if not given:
        return cfg

    try:
        loadtest = type(cfg.loadtest).model_validate({**cfg.loadtest.model_dump(), **given})
    except ValidationError as exc:
        err = exc.errors()[0]
        name = str(err["loc"][0]) if err["loc"] else ""
        raise LoadTestUsageError(f"{DATASET_FLAGS.get(name, name)}: {err['msg'].removeprefix('Value error, ')}") from None
    return cfg.model_copy(update={"loadtest": loadtest})


def primary_draft_len(cfg: DeploymentConfig) -> int | None:
    return cfg.method_info.primary_draft_len(cfg.speculation)


def check_forced_lengths(cfg: DeploymentConfig, deployments: dict[str, ArmDeployment]) -> None:
    """``ignore_eos`` needs a request input that forces the length: the llmapi model has none
    (its inputs are ``sampling_param_*`` for a fixed list of fields without min_tokens or
    ignore_eos: pipeline/trtllm/llmapi_facts.yaml, from upstream's config.pbtxt). ``deployments``:
    each measured arm as rendered."""
    if not cfg.loadtest.ignore_eos or cfg.loadtest.transport == "openai":
        return
    if any(d.contract == "llmapi" for d in deployments.values()):
        raise LoadTestUsageError(
            "loadtest.ignore_eos / --ignore-eos: the Triton llmapi model takes no min_tokens or ignore_eos "
            "input, so output lengths cannot be forced over it; drop the option or load-test "
            "trtllm-serve's OpenAI endpoint (transport openai)")


def check_sweep(cfg: DeploymentConfig, sweep: list[int], speculative: ArmDeployment | None) -> None:
    """``--sweep-draft-len`` can be sent: the method takes K per request and the speculative arm, as
    rendered (``speculative``: its descriptor; None when that arm is not measured), is the BLS that
    reads it, within the engine's draft limit."""
    if not sweep:
        return
    if not cfg.method_info.per_request_draft_len:
        raise LoadTestUsageError(
            f"--sweep-draft-len: method '{cfg.method}' fixes its draft length when the engine is built "
            "(Medusa heads / EAGLE tree, max_draft_len); build one deployment per length and load-test "
            "each. Per-request draft lengths exist only for draft_target (num_draft_tokens)."
        )
    if speculative is None:
        return  # the speculative arm is not measured: no draft length is sent
    if speculative.drafts == "engine":
        raise LoadTestUsageError(
            "--sweep-draft-len: speculation.orchestration 'engine' fixes num_draft_tokens in the engine; "
            "per-request draft lengths need orchestration 'bls'"
        )
    limit = speculative.max_draft_len
    too_long = [k for k in sweep if limit is not None and k > limit]
    if too_long:
        raise LoadTestUsageError(f"--sweep-draft-len: {too_long} exceed the engine's max_draft_len {limit}")
