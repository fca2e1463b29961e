"""Static speculation trees (Medusa ``medusa_choices``, EAGLE-1 ``eagle_choices``) as root-less
paths, e.g. ``[[0], [0, 0], [1]]``: checking, the default chain, depth and the brace text the
TensorRT-LLM backend parses. Used by config, plan and render; reads and writes nothing. (The
reference engine's proposers keep their own copy while that package is being reorganised.)"""

from __future__ import annotations


def tree_problems(choices: list[list[int]]) -> list[str]:
    """Structural problems of a tree given as root-less paths (empty list = well-formed)."""
    problems: list[str] = []
    if not choices:
        return ["needs at least one path, or leave it out for a single chain"]
    seen: set[tuple[int, ...]] = set()
    for path in choices:
        key = tuple(path)
        if not key:
            problems.append("contains an empty path (paths omit the root; the root is implicit)")
        elif key in seen:
            problems.append(f"path {list(key)} appears twice")
        seen.add(key)
    for path in choices:
        for cut in range(1, len(path)):
            if tuple(path[:cut]) not in seen:
                problems.append(f"path {list(path)} needs its prefix {list(path[:cut])} in the tree")
                break
    return problems


def chain_choices(depth: int) -> list[list[int]]:
    """The default tree: one chain of ``depth`` top-1 nodes, e.g. [[0], [0, 0], [0, 0, 0]]."""
    return [[0] * d for d in range(1, depth + 1)]


def choices_or_chain(choices: list[list[int]] | None, depth: int) -> list[list[int]]:
    """The configured tree, or the chain of ``depth`` when none is configured."""
    return choices if choices else chain_choices(depth)


def tree_depth(choices: list[list[int]]) -> int:
    return max((len(p) for p in choices), default=0)


def tree_non_leaves_per_level(choices: list[list[int]]) -> list[int]:
    """Number of nodes with children at each depth (level 0 = the root)."""
    parents = {tuple(p[:-1]) for p in choices if p}
    return [sum(1 for p in parents if len(p) == level) for level in range(tree_depth(choices))]


def brace_choices(choices: list[list[int]]) -> str:
    """[[0], [0, 1]] → '{0}, {0, 1}' (the only tree syntax the C++ backend parses)."""
    return ", ".join("{" + ", ".join(str(i) for i in path) + "}" for path in choices)
