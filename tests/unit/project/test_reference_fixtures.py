"""The random checkpoints the reference-engine tests share are stored, not written per process
(tests/reference_fixtures.py): the stored files must be exactly what ``make_all`` writes."""

from __future__ import annotations

import hashlib

import pytest

from tests.reference_fixtures import STORED, make_all


def _digests(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.slow  # imports transformers' Llama (~4 CPU s)
def test_the_stored_checkpoints_are_what_make_all_writes(tmp_path):
    written = make_all(tmp_path)
    assert sorted(written) == sorted(d.name for d in STORED.iterdir())  # the names shared_checkpoints gives
    assert _digests(tmp_path) == _digests(STORED), "python -m tests.reference_fixtures stores them again"
