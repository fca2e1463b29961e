"""The training path end to end (`specdeploy demo train --smoke`): every model lands in its exact
checkpoint format and loads; and two runs give byte-identical files (same SHA256SUMS.txt), with
the EAGLE head trained in a second process or in this one. Bit-identity is proven on a recipe with
the smoke recipe's shapes and fewer steps (``FEWER_STEPS``): a step repeats the same seeded,
one-thread kernels, so a count that reproduces proves the same as a larger one."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from pipeline import demo  # noqa: E402 - after the importorskip above
from pipeline.cli import run  # noqa: E402 - after the importorskip above
from pipeline.demo import train  # noqa: E402 - after the importorskip above

# the smoke recipe's model shapes, corpus and pools with fewer steps and a smaller evaluation: what
# the tests using it check (reproducibility, the second process, where first-use models land) does
# not depend on how well the models are trained (the smoke recipe's files are checked below)
FEWER_STEPS = dataclasses.replace(train.SMOKE, target_steps=4, warmup=1, draft_steps=2, medusa_steps=2,
                                  eagle_steps=2, eagle3_steps=2, eval_prompts_per_category=1, eval_new_tokens=4)


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    """The CLI's training of ``--smoke`` (the EAGLE head in a second process) → its directory. The
    recipe is ``FEWER_STEPS``: what the tests using it check (the files, formats, shapes, the
    report, retraining one model, one EAGLE pass) does not depend on the step counts, and the smoke
    recipe's own steps cost about 17 CPU s more (``test_fewer_steps_is_the_smoke_recipe_with_fewer_steps``)."""
    out = tmp_path_factory.mktemp("smoke")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train, "SMOKE", FEWER_STEPS)
        assert run(["demo", "train", "--smoke", "--quiet", "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """Two trainings of ``FEWER_STEPS``: the first-use path, which trains the models into the cache
    with ``train_all``'s defaults (the EAGLE head in a second process; ``train.FULL`` patched to
    ``FEWER_STEPS``), and ``train_all(parallel=False)`` in this process. Equal files from the two
    show both that a run is reproducible and that the second process changes nothing (a third
    training proved only the first). → root (of the patched shipped and cache dirs), first_use
    (the path ``resolve_builtin`` returned), sums and report (the cache's SHA256SUMS.txt and
    training report as trained), serial_dir and serial (the in-process run's dir and report)."""
    root = tmp_path_factory.mktemp("first-use")
    with pytest.MonkeyPatch.context() as patch:
        _no_shipped_models(patch, root)
        path = demo.resolve_builtin("builtin:tiny-eagle")
    cache = root / "cache" / "demo"
    sums, report = (cache / "SHA256SUMS.txt").read_text(), json.loads((cache / "training_report.json").read_text())
    serial_dir = tmp_path_factory.mktemp("in-process")
    serial = train.train_all(serial_dir, FEWER_STEPS, show_progress=False, parallel=False)
    return SimpleNamespace(root=root, first_use=path, sums=sums, report=report, serial_dir=serial_dir, serial=serial)


def _no_shipped_models(patch, root):
    """No shipped models; the cache under ``root``; first use trains ``FEWER_STEPS``."""
    patch.setattr(demo, "ARTIFACTS_DIR", root / "not-shipped")
    patch.setenv("SPECDEPLOY_CACHE", str(root / "cache"))
    patch.setattr(train, "FULL", FEWER_STEPS)


def test_fewer_steps_is_the_smoke_recipe_with_fewer_steps():
    """What ``FEWER_STEPS`` stands in for: the smoke recipe's shapes, corpus and pools; only step
    counts and the evaluation's size differ."""
    steps = {"target_steps", "warmup", "draft_steps", "medusa_steps", "eagle_steps", "eagle3_steps",
             "eval_prompts_per_category", "eval_new_tokens"}
    differ = {f.name for f in dataclasses.fields(FEWER_STEPS) if getattr(FEWER_STEPS, f.name) != getattr(train.SMOKE, f.name)}
    assert differ and differ <= steps, differ - steps


@pytest.mark.slow
def test_two_runs_are_bit_identical(two_runs):
    sums = two_runs.sums
    assert sums == (two_runs.serial_dir / "SHA256SUMS.txt").read_text()
    assert len(sums.splitlines()) == 6 + 6 + 2 + 2 + 2  # target, draft, medusa, eagle, eagle3 files


@pytest.mark.slow
def test_eagle_in_a_second_process_gives_the_same_files(two_runs, smoke_run):
    """``train_all`` (the CLI's and first use's) trains the EAGLE head in a second process beside
    the draft and Medusa heads; training everything in one process must give byte-identical files."""
    parallel, serial = two_runs.report, two_runs.serial
    assert "parallel" not in serial
    assert (two_runs.serial_dir / "SHA256SUMS.txt").read_text() == two_runs.sums
    assert parallel["parallel"] == ["tiny-eagle"]
    assert parallel["quality"] == serial["quality"]
    assert json.loads((smoke_run / "training_report.json").read_text())["parallel"] == ["tiny-eagle"]


@pytest.mark.slow
def test_smoke_outputs_load_and_verify(smoke_run):
    from transformers import AutoTokenizer, LlamaForCausalLM

    from pipeline.demo.heads import load_eagle, load_medusa

    out = smoke_run
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
def test_retraining_one_model_reuses_the_target(smoke_run, tmp_path, monkeypatch):
    import shutil

    out = tmp_path / "one"
    shutil.copytree(smoke_run, out)
    (out / "tiny-medusa" / "medusa_lm_head.safetensors").unlink()
    monkeypatch.setattr(train, "SMOKE", FEWER_STEPS)  # smoke_run's recipe
    assert run(["demo", "train", "--smoke", "--quiet", "--only", "tiny-medusa", "--out", str(out)]) == 0
    assert (out / "SHA256SUMS.txt").read_text() == (smoke_run / "SHA256SUMS.txt").read_text()


@pytest.mark.slow
def test_eagle_one_pass_training_changes_only_the_eagle_head(smoke_run, tmp_path):
    """The recipe trains EAGLE in two passes (the second on the head's own predicted features);
    ``eagle_unroll: 1`` drops that pass: a different head whose loss is one positive term
    fewer, every other model's files untouched."""
    import shutil

    from pipeline.demo.heads import load_eagle

    assert FEWER_STEPS.eagle_unroll == train.SMOKE.eagle_unroll == train.FULL.eagle_unroll == 2
    out = tmp_path / "one-pass"
    shutil.copytree(smoke_run, out)
    report = train.train_all(out, dataclasses.replace(FEWER_STEPS, eagle_unroll=1), only=train.EAGLE,
                             show_progress=False)
    before, after = demo.read_sums(smoke_run), demo.read_sums(out)
    changed = {name for name in before if before[name] != after[name]}
    assert changed == {"tiny-eagle/model.safetensors"}
    two_passes = json.loads((smoke_run / "training_report.json").read_text())["models"]["tiny-eagle"]
    assert report["models"]["tiny-eagle"]["final_loss"] < two_passes["final_loss"]
    load_eagle(out / "tiny-eagle")


@pytest.mark.slow
def test_missing_shipped_artifacts_train_into_the_cache_once(two_runs, monkeypatch):
    """First use trained the models into the cache (``two_runs``); a second use verifies them
    rather than retraining, and corrupted weights are caught."""
    _no_shipped_models(monkeypatch, two_runs.root)  # a retrain would be of FEWER_STEPS too, and caught below
    cache = two_runs.root / "cache" / "demo"
    assert two_runs.first_use == cache / "tiny-eagle"
    weights = cache / "tiny-eagle" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    assert demo.resolve_builtin("tiny-target") == cache / "tiny-target"
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
