"""Every figure the docs quote can be traced to the script and the run that produced it.

Each ``benchmarks/results/*.json`` carries a ``provenance`` block (written by
``pipeline.infra.provenance.result_provenance`` in every script of ``benchmarks/`` and by
``specdeploy bench --output``): the command, the commit it ran on, the date and the machine. Files
committed before the scripts recorded that carry a back-filled block naming the script and the
commit that added them; that list can only shrink (re-running one replaces its block). A result
measured elsewhere (another checkout, e.g. "before" on main's code) and copied in says so
(``copied_from``: the command's own output). The docs may quote only files that exist here."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipeline.infra.provenance import result_provenance
from pipeline.paths import PROJECT_ROOT

RESULTS = PROJECT_ROOT / "benchmarks" / "results"
RESULT_FILES = sorted(RESULTS.glob("*.json"))
SHA = re.compile(r"[0-9a-f]{40}")
# written before the benchmarks recorded their command line and checkout; re-run to drop one
BACKFILLED_WITHOUT_COMMAND = {
    "eagle-training",
}


def provenance_problems(name: str, data: dict) -> list[str]:
    """What is missing for ``name``'s figures to be reproduced (empty: nothing)."""
    prov = data.get("provenance") if isinstance(data, dict) else None
    if not isinstance(prov, dict):
        return ["no provenance block"]
    problems = [f"provenance.{key} missing" for key in ("commit", "date", "machine") if not prov.get(key)]
    if prov.get("commit") and not SHA.fullmatch(prov["commit"]):
        problems.append(f"provenance.commit {prov['commit']!r} is not a commit id")
    command = prov.get("command")
    if not command and name not in BACKFILLED_WITHOUT_COMMAND:
        problems.append("provenance.command missing")
    script = prov.get("script") or _script_of(command or "")
    if script is None:
        problems.append(f"no benchmarks/ script or `specdeploy bench` wrote it (command {command!r})")
    elif script != "specdeploy bench" and not (PROJECT_ROOT / script).is_file():
        problems.append(f"{script} does not exist")
    elif command and name + ".json" not in command and script != "specdeploy bench" \
            and name + ".json" not in (PROJECT_ROOT / script).read_text() \
            and not (prov.get("copied_from") and prov["copied_from"] in command) \
            and not (prov.get("renamed_from") and prov["renamed_from"] in (PROJECT_ROOT / script).read_text()):
        problems.append(f"neither the command nor {script} names {name}.json (nor says where it was copied "
                        f"or renamed from)")
    return problems


def _script_of(command: str) -> str | None:
    match = re.search(r"(benchmarks/[a-z0-9_]+\.py)", command)
    if match:
        return match.group(1)
    return "specdeploy bench" if re.search(r"specdeploy\S* bench\b|pipeline\.cli bench\b", command) else None


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.stem for p in RESULT_FILES])
def test_every_result_file_says_how_it_was_made(path: Path):
    assert provenance_problems(path.stem, json.loads(path.read_text())) == []


def test_the_backfilled_list_only_names_files_that_still_lack_a_command():
    stale = {name for name in BACKFILLED_WITHOUT_COMMAND
             if not (RESULTS / f"{name}.json").is_file()
             or (json.loads((RESULTS / f"{name}.json").read_text()).get("provenance") or {}).get("command")}
    assert stale == set(), "re-run files leave the list: remove them from BACKFILLED_WITHOUT_COMMAND"


def test_a_hand_written_or_renamed_result_is_caught():
    """Negative controls: what each rule exists to catch."""
    fresh = {"provenance": result_provenance(["python", "benchmarks/bench_loadgen.py", "--out",
                                              "benchmarks/results/x.json"])}
    assert provenance_problems("x", fresh) == []
    assert provenance_problems("x", {"figures": 1}) == ["no provenance block"]
    renamed = {"provenance": {**fresh["provenance"]}}
    assert provenance_problems("y", renamed) == [
        "neither the command nor benchmarks/bench_loadgen.py names y.json (nor says where it was copied or renamed from)"]
    # a rename says so, from a name the script writes; a name it does not write is not enough
    assert provenance_problems("y", {"provenance": {**fresh["provenance"], "renamed_from": "loadgen.json"}}) == []
    assert provenance_problems("y", {"provenance": {**fresh["provenance"], "renamed_from": "z.json"}}) != []
    copied = {"provenance": {**fresh["provenance"], "copied_from": "benchmarks/results/x.json"}}
    assert provenance_problems("y", copied) == []  # a copy says so: the command's own output is named
    by_hand = {"provenance": {**fresh["provenance"], "command": "vim x.json"}}
    assert "no benchmarks/ script or `specdeploy bench` wrote it (command 'vim x.json')" in provenance_problems("x", by_hand)
    no_commit = {"provenance": {**fresh["provenance"], "commit": None}}
    assert provenance_problems("x", no_commit) == ["provenance.commit missing"]


def test_fresh_provenance_records_the_run():
    prov = result_provenance(["python", "benchmarks/bench_engine.py"])
    assert prov["command"] == "python benchmarks/bench_engine.py"
    assert SHA.fullmatch(prov["commit"]) and prov["date"].endswith("+00:00")
    assert prov["machine"]["cpus"] >= 1 and len(prov["machine"]["load_average"]) == 3


# docs/performance.md is generated from the files themselves (it may repeat a note recorded in one)
DOCS = [*sorted(p for p in (PROJECT_ROOT / "docs").glob("*.md") if p.name != "performance.md"),
        PROJECT_ROOT / "README.md", PROJECT_ROOT / "locustfiles" / "README.md"]


def test_docs_quote_only_result_files_that_exist():
    quoted = {(doc.name, name) for doc in DOCS for name in re.findall(r"benchmarks/results/([\w.-]+\.json)", doc.read_text())}
    missing = sorted((doc, name) for doc, name in quoted if not (RESULTS / name).is_file())
    assert missing == []
