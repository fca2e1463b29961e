"""pipeline.infra: the atomic writer, provenance and the tree helpers every stage shares."""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from pipeline.infra import atomic, provenance, trees


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    path = tmp_path / "sub" / "a.json"
    atomic.write_json_atomic(path, {"a": 1})
    assert json.loads(path.read_text()) == {"a": 1}
    with pytest.raises(TypeError):
        atomic.write_json_atomic(path, {"a": object()})  # fails while serialising: nothing replaced
    assert json.loads(path.read_text()) == {"a": 1}
    assert sorted(p.name for p in path.parent.iterdir()) == ["a.json"]  # no temporary left behind


def _git(cwd, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": os.environ["PATH"], "HOME": str(cwd)}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout.strip()


def test_git_sha_is_the_checkout_head(tmp_path):
    """A checkout of known history: the recorded sha is its HEAD, and a directory with no git
    history records none (provenance then says so instead of inventing one)."""
    repo, plain = tmp_path / "repo", tmp_path / "plain"
    repo.mkdir()
    plain.mkdir()
    _git(repo, "init", "-q")
    (repo / "f").write_text("x")
    _git(repo, "add", "f")
    _git(repo, "commit", "-q", "-m", "one")
    head = _git(repo, "rev-parse", "HEAD")
    assert re.fullmatch(r"[0-9a-f]{40}", head)
    assert provenance.git_sha(repo) == head
    assert provenance.git_sha(plain) is None


def test_provenance():
    assert provenance.git_sha(provenance.PROJECT_ROOT / "no-such-dir") is None
    assert provenance.package_version("no-such-distribution-xyz", "pydantic") is not None
    assert provenance.package_version("no-such-distribution-xyz") is None
    found = provenance.versions(("pydantic", "no-such-distribution-xyz"))
    assert found["python"] and found["pydantic"] and found["no-such-distribution-xyz"] is None


def test_one_tree_module_serves_config_plan_and_render():
    import pipeline.config as config
    import pipeline.methods.eagle as eagle
    import pipeline.methods.medusa as medusa

    assert config.chain_choices is trees.chain_choices and config.tree_problems is trees.tree_problems
    assert config.format_choices is trees.brace_choices and medusa.brace_choices is eagle.brace_choices is trees.brace_choices
    assert trees.choices_or_chain(None, 2) == [[0], [0, 0]] and trees.choices_or_chain([[1]], 2) == [[1]]
