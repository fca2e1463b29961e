"""One report of the committed fixture run (tests/fixtures/run_small/), unchanged, shared by the
report tests that only read it: each render costs about 1.5 CPU seconds, and five modules read the
same one. A test that changes the run or its config copies the fixture itself (report_fixtures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.report_fixtures import copy_fixture


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> Path:
    """The fixture run, reported once (report.json / .md / .html next to it): read it, never write."""
    # imported here, not at the top: the quick tier's tests in this package never pay for the
    # builder's imports (matplotlib) unless a slow test asks for this fixture
    from pipeline.report.builder import make_report

    target = copy_fixture(tmp_path_factory.mktemp("rendered") / "run")
    make_report(target)
    return target
