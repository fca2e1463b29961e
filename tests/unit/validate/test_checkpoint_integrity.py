"""A broken checkpoint stops `validate` (issue 44): a truncated or non-JSON safetensors file, a
shard that is missing or lacks its tensors, a draft of another architecture, tensors contradicting
config.json. Each used to pass validate, build and render and fail only when `serve` loaded it.

The draft is the built-in tiny draft (pipeline/demo/artifacts), linked file by file into a
temporary directory so one file can be broken without copying the rest."""

from __future__ import annotations

import json
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from safetensors.numpy import load_file, save_file

from pipeline.config import parse_config
from pipeline.demo import ARTIFACTS_DIR
from pipeline.errors import PreflightError
from pipeline.validate.preflight import errors_of, run_preflight
from pipeline.validate.weight_integrity import (
    checkpoint_problems,
    pickle_archive_problem,
    safetensors_problems,
    weight_file_problems,
)
from tests.unit.cli_inproc import specdeploy

REPO = Path(__file__).resolve().parents[3]
TARGET = ARTIFACTS_DIR / "tiny-target"
DRAFT = ARTIFACTS_DIR / "tiny-draft"


def linked_draft(tmp_path: Path, *, but: tuple[str, ...] = ()) -> Path:
    """The tiny draft as symlinks under ``tmp_path/draft``, leaving out the files ``but`` names."""
    draft = tmp_path / "draft"
    draft.mkdir()
    for f in DRAFT.iterdir():
        if f.name not in but:
            (draft / f.name).symlink_to(f)
    return draft


def write_config(tmp_path: Path, draft: Path) -> Path:
    data = yaml.safe_load((REPO / "configs/tiny-cpu-draft-target.yaml").read_text())
    data["target"]["checkpoint"] = str(TARGET)
    data["speculation"]["draft"]["checkpoint"] = str(draft)
    data["loadtest"]["prompts"] = str(REPO / "prompts/tiny")
    path = tmp_path / "dt.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def validate_fails_naming(tmp_path: Path, draft: Path, *needles: str) -> str:
    """`specdeploy validate` exits with the preflight's exit code and its stderr names ``needles``."""
    result = specdeploy("validate", write_config(tmp_path, draft))
    assert result.returncode == PreflightError.exit_code != 0, (result.returncode, result.stderr)
    error_lines = [line for line in result.stderr.splitlines() if "speculation.draft.checkpoint" in line]
    assert any(all(n in line for n in needles) for line in error_lines), result.stderr
    return result.stderr


def test_the_intact_checkpoints_pass(tmp_path):
    result = specdeploy("validate", write_config(tmp_path, linked_draft(tmp_path)))
    assert result.returncode == 0, result.stderr
    assert weight_file_problems(DRAFT)[0] == [] and weight_file_problems(TARGET)[0] == []


def test_truncated_weights_fail_validate_naming_the_file(tmp_path):
    draft = linked_draft(tmp_path, but=("model.safetensors",))
    whole = (DRAFT / "model.safetensors").read_bytes()
    (draft / "model.safetensors").write_bytes(whole[: len(whole) - 4096])
    validate_fails_naming(tmp_path, draft, f"{draft}/model.safetensors is truncated",
                          f"declares {len(whole)} bytes, the file has {len(whole) - 4096}")


def test_header_that_is_not_json_fails_validate(tmp_path):
    draft = linked_draft(tmp_path, but=("model.safetensors",))
    garbage = b"<html>503 Service Unavailable</html>"
    (draft / "model.safetensors").write_bytes(struct.pack("<Q", len(garbage)) + garbage)
    validate_fails_naming(tmp_path, draft, f"{draft}/model.safetensors has a header that is not JSON")


def test_draft_of_another_architecture_fails_validate(tmp_path):
    draft = linked_draft(tmp_path, but=("config.json",))
    config = json.loads((DRAFT / "config.json").read_text())
    config.update(architectures=["MistralForCausalLM"], model_type="mistral")
    (draft / "config.json").write_text(json.dumps(config))
    validate_fails_naming(tmp_path, draft, f"{draft}/config.json names model_type 'mistral'",
                          "the CPU reference engine (LlamaModel) loads LlamaForCausalLM")


def _shard(draft: Path) -> tuple[Path, Path]:
    """The draft's weights as two shards and an index, as save_pretrained writes a large model."""
    state = load_file(str(DRAFT / "model.safetensors"))
    names = sorted(state)
    first, second = names[: len(names) // 2], names[len(names) // 2:]
    shards = (draft / "model-00001-of-00002.safetensors", draft / "model-00002-of-00002.safetensors")
    save_file({n: state[n] for n in first}, str(shards[0]))
    save_file({n: state[n] for n in second}, str(shards[1]))
    weight_map = {**{n: shards[0].name for n in first}, **{n: shards[1].name for n in second}}
    (draft / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return shards


def test_sharded_checkpoint_is_checked_shard_by_shard(tmp_path):
    draft = linked_draft(tmp_path, but=("model.safetensors",))
    first, second = _shard(draft)
    assert weight_file_problems(draft)[0] == []
    result = specdeploy("validate", write_config(tmp_path, draft))
    assert result.returncode == 0, result.stderr
    second.write_bytes(second.read_bytes()[:-1])
    validate_fails_naming(tmp_path, draft, f"{second} is truncated")


def test_missing_shard_fails_validate(tmp_path):
    """Already caught before issue 44 (weight_files.index_problems); kept beside the shard checks."""
    draft = linked_draft(tmp_path, but=("model.safetensors",))
    _, second = _shard(draft)
    second.unlink()
    validate_fails_naming(tmp_path, draft, "names shards that are missing", second.name)


def test_a_shard_without_the_tensors_the_index_places_in_it(tmp_path):
    draft = linked_draft(tmp_path, but=("model.safetensors",))
    first, second = _shard(draft)
    save_file({"unrelated": np.zeros((2,), np.float32)}, str(second))
    validate_fails_naming(tmp_path, draft, "places", f"in {second}, which does not hold them")


def test_tensors_contradicting_config_json(tmp_path):
    draft = linked_draft(tmp_path, but=("config.json",))
    config = json.loads((DRAFT / "config.json").read_text())
    (draft / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 2, "hidden_size": 128}))
    cfg = parse_config(yaml.safe_load(write_config(tmp_path, draft).read_text()))
    messages = [p.message for p in checkpoint_problems(cfg, "draft", draft)]
    assert any(m.startswith("model.embed_tokens.weight is [1024, 256] in the weights but "
                            f"{draft}/config.json says vocab_size 1024 × hidden_size 128") for m in messages), messages
    assert any("num_hidden_layers 2 but the weights hold layers 0..0 (missing layers [1])" in m for m in messages)
    assert {f.check for f in errors_of(run_preflight(cfg))} >= {"weights"}


def test_file_level_checks(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"a": np.zeros((3, 4), np.float32)}, str(path))
    assert safetensors_problems(path) == []
    path.write_bytes(path.read_bytes() + b"\0" * 7)
    assert safetensors_problems(path) == [f"{path} has 7 bytes past the end its header declares "
                                          f"({path.stat().st_size - 7} bytes): not a file safetensors loads"]
    header = json.dumps({"a": {"dtype": "F32", "shape": [3, 4], "data_offsets": [0, 40]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 40)
    (problem,) = safetensors_problems(path)
    assert "F32 [3, 4] needs 48 bytes, its data_offsets span 40" in problem
    path.write_bytes(b"\1\2")
    assert safetensors_problems(path) == [f"{path} is 2 bytes, shorter than a safetensors header length"]


def test_zip_pickles_are_checked_without_unpickling(tmp_path):
    archive = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(archive, "w") as z:  # the layout torch.save writes: a zip of data.pkl + storages
        z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        z.writestr("archive/data/0", b"\0" * 4096)
    assert pickle_archive_problem(archive) is None
    archive.write_bytes(archive.read_bytes()[:-30])
    assert "is not a whole torch zip archive" in pickle_archive_problem(archive)
    legacy = tmp_path / "medusa_lm_head.pt"
    legacy.write_bytes(b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8P\x19.")  # legacy torch.save: a bare pickle stream
    assert pickle_archive_problem(legacy) is None


@pytest.mark.parametrize("role", ["medusa heads", "EAGLE head"])
def test_heads_take_their_own_architecture(tmp_path, role):
    cfg = parse_config(yaml.safe_load((REPO / "configs/tiny-cpu-eagle.yaml").read_text()))
    assert checkpoint_problems(cfg, role, ARTIFACTS_DIR / ("tiny-medusa" if role == "medusa heads" else "tiny-eagle")) == []
