"""`specdeploy doctor` reports the real tritonserver of the pytriton wheel; `find_tritonserver`
locates binary, backends and the Python stub; `specdeploy schema` documents every field."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from pipeline.cli import run
from pipeline.config import DeploymentConfig
from pipeline.errors import SpecdeployError
from pipeline.serve.tritonserver_install import ENV_OVERRIDE, STUB_NAME, find_tritonserver, from_pytriton

PY = f"{sys.version_info.major}.{sys.version_info.minor}"


def test_find_tritonserver_uses_the_pytriton_wheel(monkeypatch):
    monkeypatch.delenv(ENV_OVERRIDE, raising=False)
    install = find_tritonserver()
    assert install.source == "pytriton"
    assert install.binary.is_file() and os.access(install.binary, os.X_OK)
    assert install.binary.parts[-4:] == ("pytriton", "tritonserver", "bin", "tritonserver")
    assert (install.backend_dir / "python" / "libtriton_python.so").is_file()
    assert install.stub_path is not None and install.stub_path.is_file()
    assert install.stub_path.parts[-3:] == ("python_backend_stubs", PY, STUB_NAME)
    assert install.placed_stub == install.backend_dir / "python" / STUB_NAME
    assert PY in install.available_stub_versions


def _fake_pytriton(root: Path, stub_versions: list[str]) -> Path:
    package = root / "pytriton"
    (package / "tritonserver" / "bin").mkdir(parents=True)
    (package / "tritonserver" / "bin" / "tritonserver").write_text("")
    (package / "tritonserver" / "backends" / "python").mkdir(parents=True)
    for version in stub_versions:
        stub_dir = package / "tritonserver" / "python_backend_stubs" / version
        stub_dir.mkdir(parents=True)
        (stub_dir / STUB_NAME).write_text("")
    return package


def test_stub_missing_for_this_python(tmp_path):
    install = from_pytriton(_fake_pytriton(tmp_path, ["3.8"]), python_version="3.11")
    assert install is not None and install.stub_path is None
    assert install.available_stub_versions == ["3.8"]
    assert not install.stub_in_place


def test_stub_versions_sort_numerically(tmp_path):
    install = from_pytriton(_fake_pytriton(tmp_path, ["3.10", "3.9", "3.12"]), python_version="3.10")
    assert install.available_stub_versions == ["3.9", "3.10", "3.12"]
    assert install.stub_path.parent.name == "3.10"


def test_no_binary_means_no_install(tmp_path):
    assert from_pytriton(tmp_path / "pytriton") is None


def test_env_override(monkeypatch, tmp_path):
    binary = tmp_path / "opt" / "tritonserver" / "bin" / "tritonserver"
    binary.parent.mkdir(parents=True)
    binary.write_text("")
    monkeypatch.setenv(ENV_OVERRIDE, str(binary))
    install = find_tritonserver()
    assert install.source == "env" and install.backend_dir == tmp_path / "opt" / "tritonserver" / "backends"
    monkeypatch.setenv(ENV_OVERRIDE, str(tmp_path / "missing"))
    with pytest.raises(SpecdeployError, match=ENV_OVERRIDE):
        find_tritonserver()


def test_doctor_reports_real_paths(capsys, monkeypatch):
    monkeypatch.delenv(ENV_OVERRIDE, raising=False)
    assert run(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    triton = report["tritonserver"]
    assert triton["found"] and Path(triton["binary"]).is_file()
    assert triton["binary"].endswith("pytriton/tritonserver/bin/tritonserver")
    assert Path(triton["stub_for_this_python"]).is_file()
    assert report["python"]["version"].startswith(PY)
    assert report["packages"]["TensorRT-LLM"] == "not installed"
    assert report["packages"]["tritonclient"] not in ("", "not installed")
    assert isinstance(report["gpus"]["gpus"], list)


def test_doctor_table(capsys, monkeypatch):
    monkeypatch.delenv(ENV_OVERRIDE, raising=False)
    assert run(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "pytriton/tritonserver/bin/tritonserver (from pytriton)" in out
    assert "TensorRT-LLM" in out and "GPUs" in out


def test_schema_markdown_has_every_field(capsys):
    assert run(["schema", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    for name in DeploymentConfig.model_fields:
        assert f"| `{name}` |" in out, name
    for path in ("target.quantization.kv_cache_dtype", "speculation.method", "triton.grpc_port",
                 "loadtest.sampling.top_k", "gate.slo.ttft_ms", "build.max_draft_len"):
        if path == "build.max_draft_len":
            assert f"`{path}`" not in out
        else:
            assert f"`{path}`" in out, path
    assert "`speculation.choices (method=eagle)`" in out
    rows = [line for line in out.splitlines() if line.startswith("| `")]
    assert all(line.count(" | ") >= 3 and not line.endswith("|  |") for line in rows)


def test_schema_json_is_the_pydantic_schema(capsys):
    assert run(["schema", "--format", "json"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert set(schema["properties"]) == set(DeploymentConfig.model_fields)
    assert schema["properties"]["hardware"]["description"]


def test_schema_rejects_unknown_format():
    with pytest.raises(SpecdeployError, match="--format"):
        run(["schema", "--format", "xml"])


def test_placed_stub_must_be_the_one_for_this_python(tmp_path):
    install = from_pytriton(_fake_pytriton(tmp_path, ["3.10", "3.11"]), python_version="3.11")
    (install.stub_path.parent.parent / "3.10" / STUB_NAME).write_text("stub for 3.10")
    install.stub_path.write_text("stub for 3.11")
    install.placed_stub.write_text("stub for 3.10")
    assert install.stub_in_place and not install.placed_stub_matches
    install.placed_stub.write_text("stub for 3.11")
    assert install.placed_stub_matches
