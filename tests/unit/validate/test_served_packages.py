"""The served models' packages (pipeline/validate/served_packages.py): what doctor reports, the
container record's pins, and the ``gpu-host`` extra that must leave the container's packages alone.
Under scripts/ngc-pinned-env.sh (SPECDEPLOY_NGC_ENV=1) the installed versions are checked against
the container's pins, so that run proves it ran where it says."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from pipeline.cli import run
from pipeline.validate import served_packages as sp

ROOT = Path(__file__).resolve().parents[3]


def test_installed_versions_and_needed_ranges():
    packages = sp.served_model_packages()
    assert set(packages) == {"numpy", "tokenizers", "transformers", "sentencepiece", "protobuf"}
    installed, required = packages["numpy"]  # name -> (installed version or None, needed range)
    import numpy

    assert installed == numpy.__version__ and required == ">=1.24"


def test_verdicts_name_a_missing_package_and_one_outside_the_range():
    assert sp.verdict(sp.ServedPackage(None, ">=4.57,<6")) == "not installed"
    assert sp.verdict(sp.ServedPackage("4.46.0", ">=4.57,<6")) == "outside >=4.57,<6"
    assert sp.verdict(sp.ServedPackage("6.0.0", ">=4.57,<6")) == "outside >=4.57,<6"
    assert sp.verdict(sp.ServedPackage("4.57.1", ">=4.57,<6")) == "ok"
    assert sp.verdict(sp.ServedPackage("5.25.0", ">=4.57,<6")) == "ok"


def test_sentencepiece_generated_for_protobuf_7_next_to_an_older_protobuf_is_named():
    def packages(sentencepiece: str, protobuf: str) -> dict:
        return {"sentencepiece": sp.ServedPackage(sentencepiece, ">=0.1.99"), "protobuf": sp.ServedPackage(protobuf, ">=4")}

    conflict = sp.pair_conflicts(packages("0.2.3", "6.33.6"))["sentencepiece"]
    assert "needs protobuf>=7 (found 6.33.6)" in conflict and "sentencepiece<0.2.3" in conflict
    assert sp.pair_conflicts(packages("0.2.2", "6.33.6")) == {}
    assert sp.pair_conflicts(packages("0.2.3", "7.36.2")) == {}


def test_doctor_shows_the_served_models_packages(capsys):
    assert run(["doctor", "--json"]) == 0
    section = json.loads(capsys.readouterr().out)["served_model_packages"]
    assert section["transformers"]["installed"] == sp.installed_version("transformers")
    assert section["transformers"]["required"] == ">=4.57,<6"
    assert all(entry["verdict"] == "ok" for entry in section.values()), section


def test_container_record_names_a_source_for_every_pin():
    record = sp.ngc_image_packages()
    assert record["image"].endswith("tritonserver:26.04-trtllm-python-py3")
    assert record["tensorrt_llm"] == "1.2.1" and record["python"] == "3.12"
    for name, entry in record["packages"].items():
        assert entry["pin"] and entry["source"] and entry["upstream"], name
    assert "transformers==4.57.1" in sp.ngc_requirements()
    # the served models' ranges admit what the container pins
    assert sp.satisfies("4.57.1", sp.SERVED_MODEL_NEEDS["transformers"][0])


def test_gpu_host_extra_leaves_the_containers_packages_alone():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    gpu_host = project["optional-dependencies"]["gpu-host"]
    names = {req.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower() for req in gpu_host}
    assert not names & {"torch", "transformers", "sentencepiece", "tensorrt-llm", "tensorrt_llm", "numpy"}
    assert not any(dep.startswith(("torch", "transformers")) for dep in project["dependencies"])


@pytest.mark.skipif(os.environ.get("SPECDEPLOY_NGC_ENV") != "1", reason="only inside scripts/ngc-pinned-env.sh")
def test_this_environment_has_the_containers_pins():
    for name, entry in sp.ngc_image_packages()["packages"].items():
        installed = sp.installed_version(name)
        assert sp.satisfies(installed, entry["pin"]), (name, installed, entry["pin"])
    assert sp.installed_version("torch") is None  # the served models run without torch
    assert sp.pair_conflicts(sp.served_model_packages()) == {}
