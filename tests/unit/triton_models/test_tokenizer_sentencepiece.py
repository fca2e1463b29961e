"""The tokenizer pre/postprocessing share (``pipeline.triton_models.tokenizer``) loads a checkpoint
that has only a SentencePiece ``tokenizer.model`` the way upstream's preprocessing does
(``AutoTokenizer.from_pretrained(dir, legacy=False, padding_side="left")``, pad token = EOS when
missing), runs custom tokenizer code only when allowed, and still reads ``tokenizer.json`` with
``tokenizers`` with the same ids and text as AutoTokenizer."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from pipeline.triton_models.tokenizer import TextTokenizer
from tests import sentencepiece_fixture as spf

TEXTS = ["The quick brown fox", "def add(a, b):\n    return a + b", "héllo ✓ 12345", "a</s>b", " x  y\nz"]


def _auto(directory: Path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(directory), legacy=False, padding_side="left", trust_remote_code=False)
    if not tok.pad_token:
        tok.pad_token = tok.eos_token
    return tok


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory) -> Path:
    return spf.write_tokenizer_dir(tmp_path_factory.mktemp("sp") / "vicuna-like")


def test_tokenizer_model_only_loads_through_autotokenizer(sp_dir):
    assert not (sp_dir / "tokenizer.json").exists()
    tok, hf = TextTokenizer(sp_dir), _auto(sp_dir)
    assert tok.backend == "transformers"
    for text in TEXTS:
        for special in (True, False):
            assert tok.encode(text, special) == hf.encode(text, add_special_tokens=special), (text, special)
        ids = tok.encode(text)
        assert ids[0] == spf.BOS_ID  # add_bos_token, as upstream's add_special_tokens=True sends
        assert tok.decode(ids + [spf.EOS_ID]) == hf.decode(ids, skip_special_tokens=True)
        assert tok.decode(ids, skip_special_tokens=False).startswith("<s>")
    assert tok.decode(tok.encode("The quick brown fox")) == "The quick brown fox"


def test_special_ids_follow_upstream(sp_dir):
    """end id = the EOS piece; no pad piece → pad = EOS (upstream sets pad_token = eos_token)."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
    tok = TextTokenizer(sp_dir)
    assert (tok.bos_id, tok.end_id, tok.pad_id) == (sp.bos_id(), sp.eos_id(), sp.eos_id()) == (1, 2, 2)
    assert tok.vocab_size == tok.base_vocab_size == sp.get_piece_size() == spf.VOCAB_SIZE
    ids = tok.encode("The quick brown fox", add_special_tokens=False)
    assert [sp.id_to_piece(i) for i in ids] == [sp.id_to_piece(i) for i in sp.encode("The quick brown fox")]


def test_tokenizer_model_without_tokenizer_config(tmp_path):
    """Only config.json + tokenizer.model: AutoTokenizer picks the class from the model type."""
    directory = spf.write_tokenizer_dir(tmp_path / "bare", with_tokenizer_config=False)
    tok, hf = TextTokenizer(directory), _auto(directory)
    assert tok.backend == "transformers" and tok.end_id == spf.EOS_ID and tok.pad_id == spf.EOS_ID
    for text in TEXTS:
        assert tok.encode(text) == hf.encode(text)
        assert tok.decode(tok.encode(text)) == hf.decode(hf.encode(text), skip_special_tokens=True)


def test_custom_tokenizer_code_is_refused_unless_configured(sp_dir, tmp_path):
    directory = tmp_path / "custom"
    directory.mkdir()
    for name in ("tokenizer.model", "config.json", "special_tokens_map.json"):
        (directory / name).write_bytes((sp_dir / name).read_bytes())
    marker = tmp_path / "custom-code-ran"
    (directory / "custom_tok.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('ran')\n"
        "from transformers import LlamaTokenizer\n\nclass CustomTokenizer(LlamaTokenizer):\n    pass\n")
    config = json.loads((sp_dir / "tokenizer_config.json").read_text())
    config.update(tokenizer_class="CustomTokenizer", auto_map={"AutoTokenizer": ["custom_tok.CustomTokenizer", None]})
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="trust_remote_code") as info:
        TextTokenizer(directory)
    assert str(directory) in str(info.value)
    assert not marker.exists()  # the checkpoint's code never ran


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nowhere")):
        TextTokenizer(tmp_path / "nowhere")


def test_tokenizer_json_reads_the_same_as_autotokenizer(tmp_path):
    """The fast path (no transformers import in the stubs) gives AutoTokenizer's ids and text."""
    import tiny_deploy

    directory = tmp_path / "bpe"
    tiny_deploy.make_tokenizer(directory)
    tok, hf = TextTokenizer(directory), _auto(directory)
    assert tok.backend == "tokenizers"
    assert (tok.end_id, tok.pad_id, tok.vocab_size) == (hf.eos_token_id, hf.pad_token_id, len(hf.get_vocab()))
    for text in TEXTS + ["</s> tricky <s>", ""]:
        for special in (True, False):
            assert tok.encode(text, special) == hf.encode(text, add_special_tokens=special)
        ids = tok.encode(text) + [2, 0]
        assert tok.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_tokenizer_compat_reads_sentencepiece_vocab(sp_dir, tmp_path):
    """A draft-target pair of SentencePiece checkpoints can be compared (same ids → compatible;
    a different vocabulary is named)."""
    import shutil

    from pipeline.validate.tokenizer_compat import compare_tokenizers, load_vocab

    draft = tmp_path / "draft"
    shutil.copytree(sp_dir, draft)
    vocab = load_vocab(sp_dir)
    assert len(vocab) == spf.VOCAB_SIZE and vocab["</s>"] == spf.EOS_ID and vocab["<unk>"] == spf.UNK_ID
    assert compare_tokenizers(sp_dir, draft) == []
    import tiny_deploy

    other = tmp_path / "bpe"
    tiny_deploy.make_tokenizer(other)
    (other / "config.json").write_text(json.dumps(spf.model_config()))
    problems = compare_tokenizers(sp_dir, other)
    assert problems and "vocabularies differ" in problems[0]


@pytest.mark.parametrize("allowed", [False, True])
def test_render_passes_target_trust_remote_code_to_pre_and_postprocessing(tmp_path, allowed):
    from pipeline.config import config_hash, parse_config
    from pipeline.render.renderer import render
    from pipeline.render.triton_rules import parse_config_file

    cfg = parse_config({"name": "trc", "backend": "reference", "hardware": "cpu",
                        "target": {"checkpoint": "/models/target", "trust_remote_code": allowed},
                        "speculation": {"method": "none"},
                        "build": {"max_batch_size": 2, "max_input_len": 64, "max_seq_len": 128}}, workdir=tmp_path)
    manifest = {"format": "specdeploy-manifest/1", "name": cfg.name, "config_hash": config_hash(cfg),
                "backend": "reference", "method": "none", "trtllm_version": cfg.trtllm_version,
                "engines": {"baseline": "/engines/trc/baseline"}, "tokenizer_dir": "/models/target",
                "max_draft_len": 0, "num_draft_tokens": None, "steps": []}
    (tmp_path / "engines" / cfg.name).mkdir(parents=True)
    (tmp_path / "engines" / cfg.name / "manifest.json").write_text(json.dumps(manifest))
    repo, _ = render(cfg)["baseline"]
    for model in ("preprocessing", "postprocessing"):
        params = parse_config_file(repo / model / "config.pbtxt").parameters
        assert params["trust_remote_code"].string_value == ("True" if allowed else "False")


@pytest.mark.slow
def test_reading_pieces_first_leaves_autotokenizer_working(tmp_path):
    """validate reads tokenizer.model as protobuf; the same process may later load it with
    AutoTokenizer. Both must agree on one generated proto module, or the second registration fails
    (a fresh interpreter, so no earlier test has imported either module yet)."""
    import subprocess

    spf.write_tokenizer_dir(tmp_path)
    code = (
        "import sys; from pipeline.validate.tokenizer_compat import load_vocab; from pathlib import Path;"
        "d = Path(sys.argv[1]); assert load_vocab(d);"
        "from transformers import AutoTokenizer;"
        "print(AutoTokenizer.from_pretrained(str(d), legacy=False)('hello')['input_ids'])"
    )
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().startswith("[")
