"""The project code a rendered Triton Python model needs, copied into the model repository.

Reads a rendered ``model.py`` and, transitively, every ``pipeline`` module it imports (function-level
imports too: the CPU ``tensorrt_llm`` model loads the reference engine lazily); writes those files
under ``<model>/1/_specdeploy/pipeline/…``. The model's ``model.py`` puts that directory first on
``sys.path``, so the repository runs inside a container (or on another host) without the project
checkout mounted at the path where ``render`` ran. Third-party packages (numpy, tokenizers, torch
for the CPU engine) still come from the Python environment of the server.
"""

from __future__ import annotations

import ast
import functools
import shutil
from pathlib import Path

from pipeline.paths import PROJECT_ROOT

CODE_DIR = "_specdeploy"
PACKAGE = "pipeline"


def _module_file(name: str, root: Path) -> Path | None:
    """``pipeline.a.b`` → ``<root>/pipeline/a/b.py`` or ``…/b/__init__.py``; None if neither exists."""
    base = root.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Absolute names of the ``pipeline`` modules (and possible submodules) a module imports."""
    names: set[str] = set()
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            names.add(target)
            names.update(f"{target}.{alias.name}" for alias in node.names)
    return {n for n in names if n == PACKAGE or n.startswith(PACKAGE + ".")}


@functools.lru_cache(maxsize=512)
def _file_imports(path: str, mtime_ns: int, module: str) -> frozenset[str]:
    return frozenset(_imported(ast.parse(Path(path).read_text(encoding="utf-8")), module, path.endswith("__init__.py")))


def module_closure(source: str, root: Path = PROJECT_ROOT) -> list[Path]:
    """Every project file (relative to ``root``) that ``source`` needs, parent packages included."""
    pending = sorted(_imported(ast.parse(source), "__main__", False))
    seen: dict[str, Path] = {}
    not_files: set[str] = set()  # names of classes and functions (``from pipeline.x import Name``)
    while pending:
        name = pending.pop()
        if name in seen or name in not_files:
            continue
        path = _module_file(name, root)
        if path is None:
            not_files.add(name)
            continue
        seen[name] = path
        parts = name.split(".")
        pending.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # parent __init__ files
        pending.extend(_file_imports(str(path), path.stat().st_mtime_ns, name))
    return sorted({p.relative_to(root) for p in seen.values()})


def copy_model_code(model_source: str, version_dir: Path, root: Path = PROJECT_ROOT) -> list[Path]:
    """Copy what ``model_source`` imports from the project into ``version_dir/_specdeploy``."""
    copied = []
    for rel in module_closure(model_source, root):
        target = version_dir / CODE_DIR / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
        copied.append(target)
    return copied
