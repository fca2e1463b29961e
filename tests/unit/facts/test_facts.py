"""The facts library (``pipeline/facts/``): one table of GPU datasheet figures, read by the hardware
profiles and the forecast alike, and no stage imported from beneath the stages."""

from __future__ import annotations

import ast

import yaml

from pipeline.facts.hardware import GPUS_FILE, PROFILES
from pipeline.forecast import figures
from pipeline.paths import PROJECT_ROOT
from tests.python_source import tree

STAGES = ("validate", "plan", "build", "render", "serve", "loadtest", "report", "forecast", "cli", "run")


def test_every_gpu_profile_takes_its_bandwidth_from_the_one_table():
    table = yaml.safe_load(GPUS_FILE.read_text(encoding="utf-8"))
    gpus = [p for p in PROFILES.values() if p.is_gpu]
    assert gpus
    for profile in gpus:
        assert profile.bandwidth_gbps == float(table[profile.name]["hbm_bandwidth_gb_s"]), profile.name
        assert table[profile.name]["source"], f"{profile.name}: a datasheet figure says where it comes from"
    assert figures.gpu_figures("h100-sxm-80gb").hbm_bandwidth_gb_s == PROFILES["h100-sxm-80gb"].bandwidth_gbps
    assert figures.gpu_figures.__defaults__ == (GPUS_FILE,), "the forecast reads the same file"


def test_facts_import_no_stage():
    for path in (PROJECT_ROOT / "pipeline" / "facts").glob("*.py"):
        for node in ast.walk(tree(path)):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[:2] not in [["pipeline", s] for s in STAGES], f"{path.name} imports {name}"
