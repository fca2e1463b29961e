"""The training path end to end (`specdeploy demo train --smoke`): every model lands in its exact
checkpoint format, loads, and two runs give byte-identical files (same SHA256SUMS.txt)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from pipeline import demo  # noqa: E402 - after the importorskip above
from pipeline.cli import run  # noqa: E402 - after the importorskip above


@pytest.fixture(scope="module")
def two_smoke_runs(tmp_path_factory):
    """Two trainings of the smoke recipe: the CLI's (the EAGLE head trained in a second process)
    and ``train_all(parallel=False)`` in this process. Equal files from the two show both that a
    run is reproducible and that the second process changes nothing (a third training, a second
    CLI run, proved only the first). Returns (CLI dir, in-process dir, in-process report)."""
    from pipeline.demo import train

    cli_out, here_out = (tmp_path_factory.mktemp(f"smoke{i}") for i in range(2))
    assert run(["demo", "train", "--smoke", "--quiet", "--out", str(cli_out)]) == 0
    report = train.train_all(here_out, train.SMOKE, show_progress=False, parallel=False)
    return cli_out, here_out, report


@pytest.mark.slow
def test_two_smoke_runs_are_bit_identical(two_smoke_runs):
    first, second, _ = two_smoke_runs
    sums = (first / "SHA256SUMS.txt").read_text()
    assert sums == (second / "SHA256SUMS.txt").read_text()
    assert len(sums.splitlines()) == 6 + 6 + 2 + 2 + 2  # target, draft, medusa, eagle, eagle3 files


@pytest.mark.slow
def test_eagle_in_a_second_process_gives_the_same_files(two_smoke_runs):
    """The CLI trains the EAGLE head in a second process beside the draft and Medusa heads;
    training everything in one process must give byte-identical files."""
    parallel_dir, serial_dir, report = two_smoke_runs
    assert "parallel" not in report
    assert (serial_dir / "SHA256SUMS.txt").read_text() == (parallel_dir / "SHA256SUMS.txt").read_text()
    parallel = json.loads((parallel_dir / "training_report.json").read_text())
    assert parallel["parallel"] == ["tiny-eagle"]
    assert parallel["quality"] == report["quality"]


@pytest.mark.slow
def test_smoke_outputs_load_and_verify(two_smoke_runs):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from pipeline.demo.heads import load_eagle, load_medusa

    out = two_smoke_runs[0]
    for name in demo.BUILTIN_NAMES:
        assert demo.verify_artifact(name, out) == out / name
        assert all(oct(p.stat().st_mode)[-3:] == "644" for p in (out / name).iterdir())
    target = LlamaForCausalLM.from_pretrained(str(out / "tiny-target"))
    draft = LlamaForCausalLM.from_pretrained(str(out / "tiny-draft"))
    assert (target.config.num_hidden_layers, draft.config.num_hidden_layers) == (6, 1)
    tokenizer = AutoTokenizer.from_pretrained(str(out / "tiny-draft"))
    assert (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id) == (1, 2, 0)
    assert len(load_medusa(out / "tiny-medusa").heads) == 5  # the recipe's medusa_heads
    eagle = load_eagle(out / "tiny-eagle")
    assert torch.equal(eagle.embed_tokens.weight, target.model.embed_tokens.weight)
    report = json.loads((out / "training_report.json").read_text())
    assert set(report["models"]) == set(demo.BUILTIN_NAMES)
    assert report["sha256"] == demo.read_sums(out)


@pytest.mark.slow
def test_retraining_one_model_reuses_the_target(two_smoke_runs, tmp_path):
    import shutil

    out = tmp_path / "one"
    shutil.copytree(two_smoke_runs[0], out)
    (out / "tiny-medusa" / "medusa_lm_head.safetensors").unlink()
    assert run(["demo", "train", "--smoke", "--quiet", "--only", "tiny-medusa", "--out", str(out)]) == 0
    assert (out / "SHA256SUMS.txt").read_text() == (two_smoke_runs[0] / "SHA256SUMS.txt").read_text()


@pytest.mark.slow
def test_eagle_one_pass_training_changes_only_the_eagle_head(two_smoke_runs, tmp_path):
    """The recipe trains EAGLE in two passes (the second on the head's own predicted features);
    ``eagle_unroll: 1`` drops that pass: a different head whose loss is one positive term
    fewer, every other model's files untouched."""
    import dataclasses
    import shutil

    from pipeline.demo import train
    from pipeline.demo.heads import load_eagle

    assert train.SMOKE.eagle_unroll == train.FULL.eagle_unroll == 2
    out = tmp_path / "one-pass"
    shutil.copytree(two_smoke_runs[0], out)
    report = train.train_all(out, dataclasses.replace(train.SMOKE, eagle_unroll=1), only=train.EAGLE,
                             show_progress=False)
    before, after = demo.read_sums(two_smoke_runs[0]), demo.read_sums(out)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"tiny-eagle/model.safetensors"}
    two_passes = json.loads((two_smoke_runs[0] / "training_report.json").read_text())["models"]["tiny-eagle"]
    assert report["models"]["tiny-eagle"]["final_loss"] < two_passes["final_loss"]
    load_eagle(out / "tiny-eagle")


@pytest.mark.slow
def test_missing_shipped_artifacts_train_into_the_cache_once(tmp_path, monkeypatch):
    import dataclasses

    from pipeline.demo import train

    monkeypatch.setattr(demo, "ARTIFACTS_DIR", tmp_path / "not-shipped")
    monkeypatch.setenv("SPECDEPLOY_CACHE", str(tmp_path / "cache"))
    # the first-use path, with fewer steps than even the smoke recipe: what is checked here is where
    # the models land, that they are verified rather than retrained and that corruption is caught;
    # none of it depends on how well they are trained (the smoke recipe's files are checked above)
    tiny = dataclasses.replace(train.SMOKE, target_steps=4, warmup=1, draft_steps=2, medusa_steps=2, eagle_steps=2,
                               eagle3_steps=2, eval_prompts_per_category=1, eval_new_tokens=4)
    monkeypatch.setattr(train, "FULL", tiny)
    path = demo.resolve_builtin("builtin:tiny-eagle")
    assert path == tmp_path / "cache" / "demo" / "tiny-eagle"
    weights = path / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert demo.resolve_builtin("tiny-target") == tmp_path / "cache" / "demo" / "tiny-target"
    assert weights.stat().st_mtime_ns == stamp  # verified, not retrained
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(demo.SpecdeployError, match="corrupted.*delete .*cache"):
        demo.resolve_builtin("tiny-eagle")


def test_demo_info_lists_every_builtin(capsys):
    assert run(["demo", "info", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == [f"builtin:{n}" for n in demo.BUILTIN_NAMES]
    for row in rows:
        if row["source"] == "shipped":
            assert row["status"] == "ok (sha256 verified)" and row["params"] > 0 and len(row["sha256"]) == 64


def test_demo_train_rejects_an_unknown_model():
    with pytest.raises(demo.SpecdeployError, match="--only: unknown demo model 'tiny-giant'"):
        run(["demo", "train", "--smoke", "--only", "tiny-giant"])
