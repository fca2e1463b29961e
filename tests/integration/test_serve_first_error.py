"""When tritonserver fails to load a model, `serve`'s error carries the cause (issue 44): a
deployment built and rendered from an intact checkpoint whose weights were then truncated (a disk
filled during a copy, a sync cut short) fails in the engine worker; Triton logs the cause once,
early, then about 60 lines of tables, so the last 40 lines only said "failed to load all models".

Real build (`specdeploy build`), render and tritonserver; the target is the built-in tiny model,
linked file by file so its weights can be replaced."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipeline.demo import ARTIFACTS_DIR
from tests.unit.cli_inproc import specdeploy

pytestmark = [pytest.mark.slow, pytest.mark.triton]


def test_a_model_that_fails_to_load_is_named_with_its_cause(tmp_path):
    from pipeline.config import load_config
    from pipeline.errors import ServeError
    from pipeline.serve.server import start_deployment

    target = tmp_path / "target"
    target.mkdir()
    for f in (ARTIFACTS_DIR / "tiny-target").iterdir():
        (target / f.name).symlink_to(f)
    config = tmp_path / "broken.yaml"
    config.write_text(yaml.safe_dump({
        "name": "broken", "backend": "reference", "hardware": "cpu",
        "target": {"checkpoint": str(target), "dtype": "float32"}, "speculation": {"method": "none"},
        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128},
        "triton": {"startup_timeout_s": 240}}))
    for stage in ("build", "render"):
        result = specdeploy(stage, config, "--workdir", tmp_path)
        assert result.returncode == 0, (stage, result.stderr)
    weights = target / "model.safetensors"
    whole = weights.resolve().read_bytes()
    weights.unlink()
    weights.write_bytes(whole[: len(whole) // 2])

    with pytest.raises(ServeError) as caught:
        start_deployment(load_config(config, tmp_path), "baseline")
    message = str(caught.value)
    lines = message.splitlines()
    assert lines[1] == "first errors in the log:", message
    assert lines[2].startswith("  tensorrt_llm: failed to load: ") and "SafetensorError" in lines[2], message
    log = Path(message.split("log ", 1)[1].split(":\n", 1)[0]).read_text(errors="replace").splitlines()
    assert not any("SafetensorError" in line for line in log[-40:])  # the tail alone never had it
