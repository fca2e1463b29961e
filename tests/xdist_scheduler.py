"""The pytest-xdist scheduler of ``./run-tests`` (docs/testing.md, "Running in parallel"): whole
groups of tests go to one worker, so each shared session server (tests/integration/conftest.py)
starts once per session, on the worker that runs every test needing it.

- A group is the tests that need one shared server, joined with every other server one of them
  needs and with every test sharing a module- or class-scoped fixture with one of them (a module's
  own server then starts once too; a parametrized one once per parameter). Any other test is in its
  module's unit, as ``--dist loadfile`` would have it.
- Groups are handed out heaviest first (an estimate: a ``slow`` or ``triton`` test counts ``SLOW_WEIGHT``, one
  marked ``weight(n)`` counts ``n`` slow tests: ``specdeploy run`` end to end costs about 10, and
  scheduled by its one slow test it ran last and alone, the full tier's tail), each
  to the next worker that runs short of work, so the long server groups start at once and the
  light modules fill the gaps.
- The controller only sees node ids (collection happens on the workers), so each worker writes its
  nodeid -> group map to a directory the controller named in ``workerinput[GROUPS_DIR]``; the
  scheduler reads it when every worker has collected. ``--dist loadgroup`` carries its groups in
  the node id instead, which pytest >= 9.2 no longer lets a plugin change (pytest-xdist #1386).

Importable without xdist (the NGC-pinned run of scripts/ngc-pinned-env.sh has none): xdist is
imported only by :func:`make_scheduler`. Writes one JSON file per worker into that directory.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from pathlib import Path

import pytest

# the shared server fixtures' names, set by tests/integration/conftest.py when it is loaded
SHARED_SERVERS = pytest.StashKey[frozenset]()
GROUPS_DIR = "specdeploy_groups_dir"  # workerinput key: where workers write their groups
SLOW_WEIGHT = 10


def needed_fixtures(item) -> set[str]:
    """The fixtures an item needs: its fixture closure and those named by ``shares`` marks (a
    parametrized fixture asking for them at run time)."""
    names = set(getattr(item, "fixturenames", ()))
    for marker in item.iter_markers("shares"):
        names.update(marker.args)
    return names


def needs(item, servers: frozenset) -> set[str]:
    """The shared servers an item needs (:func:`needed_fixtures`)."""
    return needed_fixtures(item) & servers


def module_fixtures(item) -> set[str]:
    """``module::fixture[param index]`` per module- or class-scoped fixture in the item's closure:
    tests sharing one start it once only on one worker."""
    info = getattr(item, "_fixtureinfo", None)
    callspec = getattr(item, "callspec", None)
    module = module_of(item.nodeid)
    keys = set()
    for name, defs in (info.name2fixturedefs.items() if info else ()):
        if defs and defs[-1].scope in ("module", "class"):
            index = callspec.indices.get(name) if callspec else None
            keys.add(f"{module}::{name}" + (f"[{index}]" if index is not None else ""))
    return keys


def item_weight(item) -> int:
    """What the scheduler counts for one test: 1, ``SLOW_WEIGHT`` if slow or ``triton`` (the quick
    tier's smoke test starts a tritonserver: seconds of wall, like a slow test; counted as 1 it ran
    last, the quick tier's tail), times ``weight(n)``."""
    if item.get_closest_marker("slow") is None and item.get_closest_marker("triton") is None:
        return 1
    marker = item.get_closest_marker("weight")
    return SLOW_WEIGHT * (int(marker.args[0]) if marker else 1)


def module_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def group_items(items: list[tuple[str, set[str], set[str], bool | int]]) -> tuple[dict[str, str], dict[str, int]]:
    """``(nodeid, shared servers it needs, its module fixtures, slow or its weight)`` per item -> (nodeid -> group,
    group -> weight).

    Union-find over items, servers and module fixtures: tests sharing a server or a module fixture
    are one group, so two servers that one test (or one module fixture) needs are one group too. A
    group with a server is named after its servers; any other test is in its module's unit (a
    module fixture's users are in one module)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for nodeid, servers, fixtures, _ in items:
        for key in [f"server:{name}" for name in servers] + [f"fixture:{key}" for key in fixtures]:
            parent[find(key)] = find("item:" + nodeid)
    members: dict[str, set[str]] = {}
    for key in list(parent):
        if key.startswith("server:"):
            members.setdefault(find(key), set()).add(key.removeprefix("server:"))
    groups, weights = {}, {}
    for nodeid, _, _, slow in items:
        root = find("item:" + nodeid)
        group = "servers:" + "+".join(sorted(members[root])) if root in members else module_of(nodeid)
        groups[nodeid] = group
        weight = (SLOW_WEIGHT if slow else 1) if isinstance(slow, bool) else slow  # item_weight's
        weights[group] = weights.get(group, 0) + weight
    return groups, weights


def write_groups(directory: str, worker: str, groups: dict[str, str], weights: dict[str, int]) -> None:
    path = Path(directory) / f"{worker}.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"groups": groups, "weights": weights}))
    os.replace(tmp, path)  # the controller never reads a half-written map


def read_groups(directory: str) -> tuple[dict[str, str], dict[str, int]]:
    """The first worker's map (all workers collect the same items); empty when none wrote one."""
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        return data["groups"], data["weights"]
    return {}, {}


def order_units(units: dict[str, list[str]], weights: dict[str, int]) -> list[str]:
    """Heaviest first; a unit with no weight (no map) counts its tests. Ties keep collection order."""
    return sorted(units, key=lambda scope: -weights.get(scope, len(units[scope])))


def make_scheduler(config, log, directory: str):
    from xdist.scheduler import LoadScopeScheduling  # only under xdist (module docstring)

    class GroupScheduling(LoadScopeScheduling):
        """``--dist loadscope`` with this module's groups as scopes and its heaviest-first order."""

        groups: dict[str, str] = {}

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid) or module_of(nodeid)

        def schedule(self) -> None:
            # LoadScopeScheduling.schedule with the groups read first and our order of units
            assert self.collection_is_completed
            if self.collection is not None:
                for node in self.nodes:
                    self._reschedule(node)
                return
            if not self._check_nodes_have_same_collection():
                self.log("**Different tests collected, aborting run**")
                return
            self.collection = list(next(iter(self.registered_collections.values())))
            if not self.collection:
                return
            self.groups, weights = read_groups(directory)
            units: dict[str, dict[str, bool]] = {}
            for nodeid in self.collection:
                units.setdefault(self._split_scope(nodeid), {})[nodeid] = False
            self.workqueue = OrderedDict((scope, units[scope]) for scope in order_units(units, weights))
            for _ in range(len(self.nodes) - len(self.workqueue)):  # more workers than units
                unused, _assigned = self.assigned_work.popitem()
                unused.shutdown()
            for node in self.nodes:
                self._assign_work_unit(node)
            for node in self.nodes:
                self._reschedule(node)
            if not self.workqueue:
                for node in self.nodes:
                    node.shutdown()

    return GroupScheduling(config, log)
