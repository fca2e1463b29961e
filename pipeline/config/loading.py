"""Loading a config: YAML text → validated :class:`~pipeline.config.DeploymentConfig`.

Reads a YAML file (``load_config``) and returns a validated :class:`DeploymentConfig`. Every
problem in the file is reported at once as ``field.path: message`` lines inside a
:class:`~pipeline.errors.ConfigError`, a key written twice in one mapping included
(:class:`StrictLoader`); no work starts on an invalid file. Later stages derive every path from the
config (``engines/<name>/…``, ``reports/<name>/…``) and stamp their outputs with :func:`config_hash`
so stale inputs can be refused.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pipeline.config.deployment import METHOD_NAMES, DeploymentConfig
from pipeline.config_base import CrossFieldError
from pipeline.errors import ConfigError


def _loc_to_path(loc: tuple[Any, ...]) -> str:
    """Pydantic error location → ``a.b[0].c`` (union tags dropped, they are not user fields)."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in METHOD_NAMES and out.endswith("speculation"):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _message(err: dict[str, Any]) -> str:
    msg = err["msg"].removeprefix("Value error, ")
    kind = err["type"]
    if kind == "extra_forbidden":
        return "unknown field (check the spelling; see `specdeploy schema`)"
    if kind == "missing":
        return "required field is missing"
    if kind == "union_tag_invalid":
        return f"unknown method {err.get('input', {}).get('method')!r}; valid: {', '.join(METHOD_NAMES)}"
    if kind == "union_tag_not_found":
        return f"needs a 'method' field: one of {', '.join(METHOD_NAMES)}"
    return msg


def format_validation_error(exc: ValidationError) -> list[str]:
    lines = []
    for err in exc.errors():
        original = (err.get("ctx") or {}).get("error")
        if isinstance(original, CrossFieldError):
            lines.extend(f"{path}: {msg}" for path, msg in original.problems)
            continue
        lines.append(f"{_loc_to_path(tuple(err['loc']))}: {_message(err)}")
    return lines


def parse_config(data: Any, source: str = "<config>", workdir: str | Path | None = None) -> DeploymentConfig:
    if not isinstance(data, dict):
        raise ConfigError(source, ["(top level): expected a mapping of fields, got " + type(data).__name__])
    try:
        cfg = DeploymentConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(source, format_validation_error(exc)) from None
    return with_workdir(cfg, workdir)


_MERGE_TAG = "tag:yaml.org,2002:merge"

# Appended to docs/config-reference.md by `specdeploy schema --format markdown`.
LOADING_RULES_MARKDOWN = """\
## Strict loading: what `specdeploy validate` refuses

- **Unknown fields** are errors (a typo must not fall back to a default), as are values out of
  range; every problem is listed at once as `field.path: message`.
- **Duplicate keys**, at any depth: `loadtest.concurrency: duplicate key 'concurrency' at lines 9
  and 13`. Plain YAML loaders keep the last value without a word; the whole file is refused
  instead. Anchors, aliases and merge keys (`<<: *base`) keep working: a key written in a mapping
  overrides the one merged into it, as YAML's merge type defines, and is not a duplicate.
- **The prompt set** (`loadtest.prompts`) is read exactly as `loadtest` reads it, with or without
  `--offline`. An absolute path is used as written; a relative one is looked up under the working
  directory, then the project root, then the config file's directory (the first that exists wins,
  and the error lists all three). A directory must hold `<category>.jsonl` files, or the field
  names one such file; every non-blank line is a JSON object with `id` and a text `prompt`
  (`category` defaults to the file name). Errors name the file and line; unknown
  `loadtest.categories` are errors too. Another format (`loadtest.dataset_name`, `dataset_path`:
  ShareGPT, chat JSONL, Hugging Face on disk, Spec-Bench, SPEED-Bench, a trace) is read the same
  way, its errors naming file, line and field (docs/workload.md).
- **Checkpoint directories** (`target.checkpoint`, `speculation.draft.checkpoint`,
  `speculation.heads_dir`, `speculation.head_dir`) must exist and be directories when `validate`
  runs without `--offline`, i.e. on the build host. A relative path is relative to the working
  directory, where `plan` and `build` make it absolute; the error names both forms. The target's
  directory is also the tokenizer directory `render` hands to `preprocessing` and `postprocessing`,
  so its `tokenizer.json` is required.
- **CPU ids** in a `reference.cpu_pinning` list must be CPUs this process may run on
  (`os.sched_getaffinity`, the mask `taskset`, cgroup cpusets and `docker --cpuset-cpus` set),
  `threads` of them per engine model of each arm (a draft-target speculative arm has two), with
  at least one allowed CPU left for the server. The error names the field, the ids and the allowed
  set. The check uses the host `validate` runs on: run it where you serve. With backend `trtllm`
  the list is ignored (a warning).
"""


class DuplicateKeyError(yaml.YAMLError):
    """One or more mappings name a key twice; ``problems`` holds one ``field.path: …`` line each."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("; ".join(problems))


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping naming a key twice at any depth.

    PyYAML keeps the last value of a repeated key without a word, so a config edited in two places
    would run with whichever came last. The composed node tree is checked before anything is
    constructed, which keeps every key's line number. Keys brought in by a merge key (``<<: *x``)
    are not duplicates: the mapping's own keys override them, as YAML's merge type defines."""

    def construct_document(self, node: yaml.Node) -> Any:
        problems: list[tuple[int, str]] = []  # (line of the repeat, message), reported in file order
        self._find_duplicates(node, "", problems, set())
        if problems:
            raise DuplicateKeyError([message for _, message in sorted(problems)])
        return super().construct_document(node)

    def _find_duplicates(self, node: yaml.Node, path: str, problems: list, visited: set[int]) -> None:
        if id(node) in visited:  # an alias: checked where its anchor was defined
            return
        visited.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                self._find_duplicates(item, f"{path}[{index}]", problems, visited)
        elif isinstance(node, yaml.MappingNode):
            self._check_mapping(node, path, problems, visited)

    def _check_mapping(self, node: yaml.MappingNode, path: str, problems: list, visited: set[int]) -> None:
        first_line: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:  # merged keys belong to this mapping's own path
                self._find_duplicates(value_node, path, problems, visited)
                key: Any = "<<"
            else:
                key = self._key_of(key_node)
                self._find_duplicates(value_node, f"{path}.{key}" if path else str(key), problems, visited)
            if key in first_line:
                where = f"{path}.{key}" if path else str(key)
                problems.append((line, f"{where}: duplicate key '{key}' at lines {first_line[key]} and {line} "
                                 "(YAML would silently keep the last value; keep one)"))
            else:
                first_line[key] = line

    def _key_of(self, key_node: yaml.Node) -> Any:
        """The key as the constructor will build it (``1`` and ``0x1`` are one key), or its text."""
        if isinstance(key_node, yaml.ScalarNode):
            try:
                key = self.construct_object(key_node)
                hash(key)
                return key
            except (yaml.YAMLError, TypeError, ValueError):
                return key_node.value
        return f"<{key_node.id} key at line {key_node.start_mark.line + 1}>"  # never equal to another


def load_yaml_strict(text: str) -> Any:
    """Parse YAML text with :class:`StrictLoader` (raises :class:`DuplicateKeyError`, ``yaml.YAMLError``)."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 - StrictLoader is a SafeLoader


def load_config(path: str | Path, workdir: str | Path | None = None) -> DeploymentConfig:
    """The validated config of the YAML file ``path``; every output of it goes under ``workdir``
    (``engines/NAME/``, ``reports/NAME/``; default: the current directory, see :mod:`pipeline.paths`)."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(str(path), [f"(file): no such config file: {path}"])
    try:
        data = load_yaml_strict(path.read_text(encoding="utf-8"))
    except DuplicateKeyError as exc:
        raise ConfigError(str(path), exc.problems) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(str(path), [f"(yaml){where}: {getattr(exc, 'problem', exc)}"]) from None
    except UnicodeDecodeError:
        raise ConfigError(str(path), ["(file): not UTF-8 text"]) from None
    cfg = parse_config(data, str(path))
    cfg.set_source_path(path.resolve())
    return with_workdir(cfg, workdir)


def with_workdir(cfg: DeploymentConfig, workdir: str | Path | None) -> DeploymentConfig:
    """``cfg`` with its outputs under ``workdir`` (absolute; None keeps the current directory)."""
    cfg._workdir = None if workdir is None else Path(workdir).absolute()
    return cfg


def config_hash(cfg: DeploymentConfig) -> str:
    """Stable hash of the validated config (defaults filled) — stamps every stage output."""
    canonical = json.dumps(cfg.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]
