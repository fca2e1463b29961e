"""The demo training's mixed precision (pipeline/demo/head_training.py): bf16 autocast only where
the CPU multiplies bf16 fast, a forced choice from the environment, and the choice handed to a
training's second process through it."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pipeline.demo import head_training  # noqa: E402 - after the importorskip above


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.delenv(head_training.AUTOCAST_ENV, raising=False)
    head_training.autocast_mode.cache_clear()
    yield monkeypatch
    head_training.autocast_mode.cache_clear()


def test_a_forced_mode_is_used_and_a_typo_is_named(fresh):
    fresh.setenv(head_training.AUTOCAST_ENV, "off")
    assert head_training.autocast_mode() == "off"
    with head_training.autocast():
        assert not torch.is_autocast_enabled("cpu")
    head_training.autocast_mode.cache_clear()
    fresh.setenv(head_training.AUTOCAST_ENV, "bf16")
    with head_training.autocast():
        assert torch.is_autocast_enabled("cpu")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    head_training.autocast_mode.cache_clear()
    fresh.setenv(head_training.AUTOCAST_ENV, "fp16")
    with pytest.raises(ValueError, match=head_training.AUTOCAST_ENV):
        head_training.autocast_mode()


@pytest.mark.parametrize("bf16_s,want", [(1.0, "bf16"), (1.9, "bf16"), (100.0, "off")])
def test_bf16_is_used_only_where_it_is_not_slower_and_the_choice_is_exported(fresh, bf16_s, want):
    fresh.setattr(head_training, "_bf16_matmul_seconds", lambda float32=False: 1.0 if float32 else bf16_s)
    assert head_training.autocast_mode() == want
    import os

    assert os.environ[head_training.AUTOCAST_ENV] == want  # a second process makes the same choice
