"""Jinja rendering shared by the engine-runtime and the LLM-API repositories: an environment with
StrictUndefined (a missing value is an error, never a hole in the file) and the filters the
templates use, template errors as :class:`~pipeline.render.triton_rules.RenderError`, and
:func:`render_atomically`: every repository is rendered into a temporary sibling, validated there
and only then renamed into place. Reads templates; writes what it is given."""

from __future__ import annotations

import fcntl
import filecmp
import functools
import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from pipeline.render.triton_rules import RenderError


def triton_bool(value: bool) -> str:
    """How the Triton TensorRT-LLM backend's parameters spell a boolean."""
    return "True" if value else "False"


def _pbstr(value) -> str:
    if isinstance(value, bool):
        value = triton_bool(value)
    if not isinstance(value, (str, int, float)):
        str(value)  # a StrictUndefined raises UndefinedError here, naming the missing value
        raise ValueError(f"parameter value {value!r} is not a string")
    return json.dumps(str(value), ensure_ascii=False)


def jinja_environment(templates_dir: Path):
    """The Jinja environment for one template directory, built once per process: building it and
    compiling its templates cost more than rendering them, and a repository is rendered per arm,
    per variant and per test. The loader still checks each template's mtime (``auto_reload``), so
    an edited template is recompiled. Callers must not change the returned environment; one that
    needs more filters builds its own with :func:`new_jinja_environment` (and caches it too)."""
    return _cached_environment(str(Path(templates_dir).resolve()))


@functools.lru_cache(maxsize=16)
def _cached_environment(templates_dir: str):
    return new_jinja_environment(Path(templates_dir))


def new_jinja_environment(templates_dir: Path):
    """A fresh environment: StrictUndefined, no autoescape, the ``pbstr``/``pystr`` filters."""
    import jinja2  # noqa: PLC0415 - start-up: jinja2 (loaded when a template is rendered; the llmapi renderers import this module for its helpers)

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
    )
    env.filters["pbstr"] = _pbstr
    env.filters["pystr"] = lambda value: json.dumps(str(value))
    return env


def render_text(env, templates_dir: Path, template_name: str, context: dict) -> str:
    import jinja2  # noqa: PLC0415 - start-up: jinja2 (loaded when a template is rendered; the llmapi renderers import this module for its helpers)

    try:
        return env.get_template(template_name).render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError([f"{templates_dir / template_name}:{exc.lineno}: template syntax error: {exc.message}"]) from None
    except jinja2.UndefinedError as exc:
        raise RenderError([f"{templates_dir / template_name}: missing value: {exc.message}"]) from None
    except (jinja2.TemplateError, ValueError, TypeError) as exc:
        raise RenderError([f"{templates_dir / template_name}: {exc}"]) from None


T = TypeVar("T")


def render_atomically(dest: Path, fill: Callable[[Path], T]) -> T:
    """Render a directory into a temporary sibling of ``dest``, then swap it in. ``fill(tmp)``
    writes and validates (raising :class:`RenderError` on a problem); on any failure the temporary
    is removed and ``dest`` keeps what it had, so a broken template fails here, never in the server.
    Returns what ``fill`` returned (the validator's warnings)."""
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        result = fill(tmp)
        swap_in(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return result


def swap_in(new: Path, dest: Path) -> None:
    """Put the rendered ``new`` at ``dest``. Concurrent runs of one config render the same
    repository while another run's server may be loading from it: a ``dest`` whose files equal
    ``new``'s is left untouched (``new`` is dropped), and the check and the swap hold a lock beside
    ``dest``, so two renders never interleave their renames."""
    lock_path = dest.with_name(f".{dest.name}.swap.lock")
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or this process ends)
        if dest.is_dir() and same_files(new, dest):
            shutil.rmtree(new, ignore_errors=True)
            return
        old = None
        if dest.exists():
            old = dest.with_name(f".{dest.name}.old-{new.name[-8:]}")
            dest.rename(old)
        new.rename(dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def same_files(a: Path, b: Path) -> bool:
    """The two trees hold the same relative paths (directories too: an ensemble's version
    directory is empty, and Triton needs it) with byte-identical file contents."""
    def listing(root: Path) -> list[tuple[str, bool]]:
        return sorted((str(p.relative_to(root)), p.is_dir() and not p.is_symlink()) for p in root.rglob("*"))

    entries = listing(a)
    if entries != listing(b):
        return False
    _, mismatch, errors = filecmp.cmpfiles(a, b, [name for name, is_dir in entries if not is_dir], shallow=False)
    return not mismatch and not errors
