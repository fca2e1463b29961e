"""The xdist grouping rules of tests/xdist_scheduler.py on hand-built items, and the scheduler's
hand-out order: each check fails if the rule it names is broken."""

from __future__ import annotations

import pytest

from tests import xdist_scheduler as xs

pytest_plugins = ["pytester"]  # test_module_fixtures_and_needs_of_real_items collects a small test file

A = "tests/integration/test_a.py"
B = "tests/integration/test_b.py"
U = "tests/unit/test_u.py"


def test_tests_sharing_a_server_form_one_group_across_modules():
    groups, _ = xs.group_items([(f"{A}::t1", {"dt_server"}, set(), True),
                                (f"{B}::t2", {"dt_server"}, set(), True),
                                (f"{B}::t3", {"medusa_server"}, set(), True)])
    assert groups[f"{A}::t1"] == groups[f"{B}::t2"] == "servers:dt_server"
    assert groups[f"{B}::t3"] == "servers:medusa_server"


def test_a_test_needing_two_servers_joins_their_groups():
    groups, _ = xs.group_items([(f"{A}::t1", {"dt_server"}, set(), True),
                                (f"{B}::t2", {"baseline_server"}, set(), True),
                                (f"{B}::both", {"dt_server", "baseline_server"}, set(), True)])
    assert set(groups.values()) == {"servers:baseline_server+dt_server"}


def test_a_module_fixture_keeps_its_users_with_the_server_group():
    fixture = {f"{A}::own_server"}
    groups, _ = xs.group_items([(f"{A}::with_server", {"dt_server"}, fixture, True),
                                (f"{A}::without", set(), fixture, True),
                                (f"{A}::unrelated", set(), set(), False)])
    assert groups[f"{A}::without"] == groups[f"{A}::with_server"] == "servers:dt_server"
    assert groups[f"{A}::unrelated"] == A  # the module's unit, free to run elsewhere


def test_each_parameter_of_a_module_fixture_is_its_own_key():
    groups, _ = xs.group_items([(f"{A}::t[none]", {"baseline_server"}, {f"{A}::servers[0]"}, True),
                                (f"{A}::u[none]", set(), {f"{A}::servers[0]"}, True),
                                (f"{A}::t[ngram]", {"ngram_server"}, {f"{A}::servers[1]"}, True)])
    assert groups[f"{A}::u[none]"] == "servers:baseline_server"
    assert groups[f"{A}::t[ngram]"] == "servers:ngram_server"


def test_tests_without_servers_are_grouped_by_module_and_weighted():
    groups, weights = xs.group_items([(f"{U}::a", set(), set(), False), (f"{U}::b", set(), set(), True),
                                      (f"{A}::c", {"dt_server"}, set(), True)])
    assert groups[f"{U}::a"] == groups[f"{U}::b"] == U
    assert weights == {U: 1 + xs.SLOW_WEIGHT, "servers:dt_server": xs.SLOW_WEIGHT}


def test_units_are_handed_out_heaviest_first():
    units = {U: {"x": False, "y": False, "z": False}, "servers:dt_server": {"s": False}, B: {"b": False}}
    assert xs.order_units(units, {U: 3, "servers:dt_server": 30, B: 1}) == ["servers:dt_server", U, B]
    # without a map (no worker wrote one) the tests are counted
    assert xs.order_units(units, {}) == [U, "servers:dt_server", B]


def test_the_map_round_trips_through_the_directory(tmp_path):
    assert xs.read_groups(str(tmp_path)) == ({}, {})
    xs.write_groups(str(tmp_path), "gw0", {"n": "g"}, {"g": 3})
    assert xs.read_groups(str(tmp_path)) == ({"n": "g"}, {"g": 3})
    assert not list(tmp_path.glob("*.tmp"))


def test_module_fixtures_and_needs_of_real_items(pytester):
    pytester.makeconftest("import pytest\n"
                          "@pytest.fixture(scope='session')\ndef dt_server(): return 1\n")
    pytester.makepyfile(test_m="""
        import pytest
        @pytest.fixture(scope="module", params=[pytest.param("a", marks=pytest.mark.shares("medusa_server")), "b"])
        def pair(request): return request.param
        @pytest.fixture
        def per_test(): return 0
        def test_server(dt_server, per_test): pass
        def test_pair(pair): pass
    """)
    items, _ = pytester.inline_genitems("-p", "no:xdist", "-W", "ignore::pytest.PytestUnknownMarkWarning")
    by_name = {item.name: item for item in items}
    servers = frozenset({"dt_server", "medusa_server"})
    assert xs.needs(by_name["test_server"], servers) == {"dt_server"}
    assert xs.needs(by_name["test_pair[a]"], servers) == {"medusa_server"}
    assert xs.needs(by_name["test_pair[b]"], servers) == set()
    assert xs.module_fixtures(by_name["test_server"]) == set()  # session and function scope: no key
    assert xs.module_fixtures(by_name["test_pair[a]"]) == {"test_m.py::pair[0]"}
    assert xs.module_fixtures(by_name["test_pair[b]"]) == {"test_m.py::pair[1]"}


def test_the_scheduler_groups_and_orders_node_ids(tmp_path):
    pytest.importorskip("xdist")
    xs.write_groups(str(tmp_path), "gw0", {f"{A}::t1": "servers:dt_server", f"{B}::t2": "servers:dt_server"},
                    {"servers:dt_server": 20, U: 1})

    class Config:
        option = type("Option", (), {"tx": ["popen"] * 2, "numprocesses": 2, "maxworkerrestart": None})()

        def getoption(self, name):
            return getattr(self.option, name, None)

        def getvalue(self, name):
            return self.getoption(name)

    sched = xs.make_scheduler(Config(), None, str(tmp_path))
    sched.groups = xs.read_groups(str(tmp_path))[0]
    assert sched._split_scope(f"{B}::t2") == sched._split_scope(f"{A}::t1") == "servers:dt_server"
    assert sched._split_scope(f"{U}::x[1]") == U  # no map entry: its module


def test_a_weighted_slow_test_counts_its_weight():
    """``weight(n)``: ``specdeploy run`` end to end, scheduled by its one slow test, ran last."""
    class Item:
        def __init__(self, *marks):
            self.marks = {m.name: m for m in marks}

        def get_closest_marker(self, name):
            return self.marks.get(name)

    assert xs.item_weight(Item()) == 1
    assert xs.item_weight(Item(pytest.mark.slow.mark)) == xs.SLOW_WEIGHT
    assert xs.item_weight(Item(pytest.mark.triton.mark)) == xs.SLOW_WEIGHT  # the quick tier's smoke test
    assert xs.item_weight(Item(pytest.mark.slow.mark, pytest.mark.weight(30).mark)) == 30 * xs.SLOW_WEIGHT
    _, weights = xs.group_items([(f"{U}::a", set(), set(), 30 * xs.SLOW_WEIGHT), (f"{A}::c", {"dt_server"}, set(), True)])
    assert weights == {U: 30 * xs.SLOW_WEIGHT, "servers:dt_server": xs.SLOW_WEIGHT}
