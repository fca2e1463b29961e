"""Published results reproduced from their reported inputs (pipeline/forecast/data/published.yaml)."""

from __future__ import annotations

import copy

import pytest

from pipeline.forecast.published import TOLERANCE, load_cases, reproduce, reproduce_all


def test_at_least_four_published_cases_reproduced_within_tolerance():
    results = reproduce_all()
    reproduced = [r for r in results if r["reproduced"]]
    assert len(reproduced) >= 4, [(r["id"], r["points"]) for r in results]
    for r in reproduced:
        for point in r["points"]:
            assert abs(point["error"]) <= TOLERANCE, (r["id"], point)


def test_every_case_names_its_source_and_every_miss_says_why():
    for r in reproduce_all():
        assert r["source"] and r["provenance"]
        if not r["reproduce"]:
            assert r["why_not"], r["id"]


@pytest.mark.parametrize("factor", [0.5, 1.8])
def test_a_wrong_acceptance_length_breaks_the_reproduction(factor):
    data = load_cases()
    case = copy.deepcopy(next(c for c in data["cases"] if c["id"] == "medusa2-vicuna7b-a100"))
    case["acceptance_length"] *= factor
    assert not reproduce(case, data["shapes"])["reproduced"]
