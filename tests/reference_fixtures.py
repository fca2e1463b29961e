"""Tiny random checkpoints in the project's formats, for reference-engine tests.

Writes into a given directory: a random Llama (HF layout via ``LlamaForCausalLM.save_pretrained``,
safetensors, plus a word-level tokenizer), random Medusa heads (``medusa_lm_head.safetensors``)
and a random EAGLE-1 head (``model.safetensors``). Seeds are fixed, so files are reproducible: the
set :func:`make_all` writes is stored in ``tests/fixtures/reference-checkpoints`` (under 1 MB),
and :func:`shared_checkpoints` copies that, because importing transformers' Llama to write it cost
each test process ~4 CPU s. ``tests/unit/project/test_reference_fixtures.py`` (slow) checks that
:func:`make_all` still writes exactly the stored files; after a deliberate change, store them again
with ``python -m tests.reference_fixtures``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.budget import session_cost

VOCAB = 96
HIDDEN = 64


def _tokenizer(out: Path, vocab: int) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for i in range(3, vocab):
        words[f"w{i}"] = i
    tok = Tokenizer(models.WordLevel(vocab=words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.save_pretrained(str(out))


def make_llama(out: Path, seed: int, layers: int = 2, vocab: int = VOCAB, hidden: int = HIDDEN,
               init_range: float = 0.15, tied: bool = True) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        rms_norm_eps=1e-6, tie_word_embeddings=tied, initializer_range=init_range,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    model = LlamaForCausalLM(cfg)
    with torch.no_grad():  # peaked, non-trivial distributions (few near-ties)
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.8, 1.2)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out), safe_serialization=True)
    _tokenizer(out, vocab)
    return out


def make_medusa(out: Path, seed: int, heads: int = 4, vocab: int = VOCAB, hidden: int = HIDDEN) -> Path:
    import torch
    from safetensors.torch import save_file

    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(heads):
        state[f"{i}.0.linear.weight"] = torch.randn(hidden, hidden, generator=g) * 0.1
        state[f"{i}.0.linear.bias"] = torch.randn(hidden, generator=g) * 0.1
        state[f"{i}.1.weight"] = torch.randn(vocab, hidden, generator=g) * 0.3
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "medusa_lm_head.safetensors"))
    (out / "config.json").write_text(json.dumps({
        "medusa_num_heads": heads, "medusa_num_layers": 1, "hidden_size": hidden,
        "vocab_size": vocab, "base_model_name_or_path": "random",
    }))
    return out


def make_eagle(out: Path, seed: int, target_dir: Path, vocab: int = VOCAB, hidden: int = HIDDEN) -> Path:
    import torch
    from safetensors.torch import load_file, save_file

    g = torch.Generator().manual_seed(seed)
    target = load_file(str(target_dir / "model.safetensors"))
    inter, kv = 2 * hidden, hidden // 2

    def rnd(*shape):
        return torch.randn(*shape, generator=g) * 0.1

    state = {
        "fc.weight": rnd(hidden, 2 * hidden), "fc.bias": rnd(hidden),
        "embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
        "layers.0.self_attn.q_proj.weight": rnd(hidden, hidden),
        "layers.0.self_attn.k_proj.weight": rnd(kv, hidden),
        "layers.0.self_attn.v_proj.weight": rnd(kv, hidden),
        "layers.0.self_attn.o_proj.weight": rnd(hidden, hidden),
        "layers.0.post_attention_layernorm.weight": torch.ones(hidden),
        "layers.0.mlp.gate_proj.weight": rnd(inter, hidden),
        "layers.0.mlp.up_proj.weight": rnd(inter, hidden),
        "layers.0.mlp.down_proj.weight": rnd(hidden, inter),
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    cfg = json.loads((target_dir / "config.json").read_text())
    cfg.update({"num_hidden_layers": 1, "bias": True, "architectures": ["LlamaForCausalLM"]})
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def make_all(root: Path) -> dict[str, Path]:
    """target, draft (another random model), medusa, eagle under ``root``."""
    target = make_llama(root / "target", seed=0)
    return {
        "target": target,
        "draft": make_llama(root / "draft", seed=1, layers=1),
        "medusa": make_medusa(root / "medusa", seed=2),
        "eagle": make_eagle(root / "eagle", seed=3, target_dir=target),
    }


STORED = Path(__file__).parent / "fixtures" / "reference-checkpoints"  # make_all's output, one dir per name

_SHARED: dict[str, Path] | None = None


def shared_checkpoints() -> dict[str, Path]:
    """One copy of the stored checkpoints per test process (removed at exit): a test may write
    next to them, never into the repository."""
    global _SHARED
    if _SHARED is None:
        import atexit
        import shutil
        import tempfile

        root = Path(tempfile.mkdtemp(prefix="specdeploy-ref-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        with session_cost():  # not the first caller's cost (tests/budget.py)
            _SHARED = {d.name: Path(shutil.copytree(d, root / d.name)) for d in sorted(STORED.iterdir())}
    return _SHARED


def one_thread() -> None:
    import torch

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass


def eager_kernels(monkeypatch):
    """:mod:`pipeline.reference.fast.kernels` loaded again where ``torch.jit.script`` fails: its
    Python functions (what a torch without TorchScript runs). The RuntimeWarnings each fallback
    gave are kept as ``fallback_warnings``."""
    import importlib.util
    import warnings

    import torch

    from pipeline.reference.fast import kernels

    def refuse(fn):
        raise RuntimeError("no TorchScript here")

    with monkeypatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setattr(torch.jit, "script", refuse)
        spec = importlib.util.spec_from_file_location("kernels_eager", kernels.__file__)
        eager = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(eager)
    eager.fallback_warnings = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return eager


def random_prompts(n: int, seed: int, vocab: int = VOCAB, min_len: int = 2, max_len: int = 12) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


def chi2_pvalue(counts, probs) -> float:
    """Chi-square goodness of fit of ``counts`` to ``probs`` (bins with expected < 5 pooled)."""
    import torch
    from scipy.stats import chisquare

    counts, probs = counts.double(), probs.double()
    expected = probs * counts.sum()
    keep = expected >= 5
    obs, exp = counts[keep].clone(), expected[keep].clone()
    tail_obs, tail_exp = counts[~keep].sum(), expected[~keep].sum()
    if tail_exp >= 5:
        obs, exp = torch.cat([obs, tail_obs[None]]), torch.cat([exp, tail_exp[None]])
    else:  # pool the small tail into the smallest kept bin
        j = int(exp.argmin())
        obs[j] += tail_obs
        exp[j] += tail_exp
    exp = exp * obs.sum() / exp.sum()
    return float(chisquare(obs.numpy(), exp.numpy()).pvalue)


if __name__ == "__main__":  # store the checkpoints again: python -m tests.reference_fixtures
    import shutil

    shutil.rmtree(STORED, ignore_errors=True)
    make_all(STORED)
