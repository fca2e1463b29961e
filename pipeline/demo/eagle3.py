"""The EAGLE-3 head of the demo target: its PyTorch module (``state_dict`` keys as upstream
EAGLE-3 checkpoints, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B: ``fc``, ``midlayer.*``, ``norm``,
``lm_head``, ``d2t``, ``t2d``), its ``config.json``, its training and its saving.

Reads the trained target and the training pool (``train.build_pool``); writes
``tiny-eagle3/{config.json,model.safetensors}``.

Semantics (the reference engine implements the same, pipeline/reference/eagle3_model.py; layer
maths as TensorRT-LLM ``tensorrt_llm/_torch/models/modeling_speculative.py`` Eagle3DecoderLayer):
the target's hidden states after decoder layers ``AUX_LAYERS`` (low, middle, high; residual
stream, before any norm) are concatenated ``[3H]`` and fused by ``fc`` (no bias) to ``g [H]``; the
one decoder layer attends over ``cat(input_layernorm(embed(x_{t+1})), hidden_norm(g))`` ``[2H]``
with ``g`` as its residual; its output ``o`` (pre-norm) is fed back as ``g`` for the next draft
step (no ``fc`` then), and ``lm_head(norm(o))`` scores a reduced draft vocabulary whose id ``d``
is target id ``d + d2t[d]``. Trained on the target's distributions only (no feature loss, as
EAGLE-3), with the training-time-test unroll the EAGLE-1 head uses (pass p feeds the head its own
outputs of pass p-1), unrolled as deep as the head drafts (``eagle3_unroll``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from pipeline.demo.head_training import autocast, pool_batches, tail_mean, train_loop, unrolled_loss
from pipeline.demo.heads import Mlp, rotary_cos_sin, rotate_half, write_json

EAGLE3_WEIGHTS = "model.safetensors"
# outputs of decoder layers 1, 2 and 4 of the 6-layer target. TensorRT-LLM's default
# (1, L//2 - 1, L - 4; tensorrt_llm/_torch/speculative/eagle3.py) gives (1, 2, 2) for L = 6, one
# layer twice, so the head records its own (as checkpoints may: eagle_aux_hidden_state_layer_ids).
AUX_LAYERS = (1, 2, 4)


class _RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class _Attention(nn.Module):
    """q/k/v over the ``[2H]`` input, o back to ``[H]``; causal over the head's own sequence."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.k_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.v_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, seq, self.heads, self.head_dim).transpose(1, 2)

        q, k, v = split(self.q_proj(x)), split(self.k_proj(x)), split(self.v_proj(x))
        cos, sin = cos.to(q.dtype), sin.to(q.dtype)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


class _MidLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float):
        super().__init__()
        self.input_layernorm = _RMSNorm(hidden, eps)
        self.hidden_norm = _RMSNorm(hidden, eps)
        self.self_attn = _Attention(hidden, heads)
        self.post_attention_layernorm = _RMSNorm(hidden, eps)
        self.mlp = Mlp(hidden, intermediate)

    def forward(self, embeds, g, cos, sin):
        x = g + self.self_attn(torch.cat([self.input_layernorm(embeds), self.hidden_norm(g)], -1), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Head(nn.Module):
    """Keys: ``fc.weight``, ``midlayer.…``, ``norm.weight``, ``lm_head.weight``; buffers ``d2t``
    (int64 [draft_vocab]) and ``t2d`` (bool [vocab]). The token embeddings are the target's."""

    def __init__(self, hidden: int, heads: int, intermediate: int, eps: float, rope_theta: float,
                 draft_ids: torch.Tensor, vocab: int, num_aux: int = len(AUX_LAYERS)):
        super().__init__()
        self.fc = nn.Linear(num_aux * hidden, hidden, bias=False)
        self.midlayer = _MidLayer(hidden, heads, intermediate, eps)
        self.norm = _RMSNorm(hidden, eps)
        self.lm_head = nn.Linear(hidden, len(draft_ids), bias=False)
        self.register_buffer("d2t", draft_ids - torch.arange(len(draft_ids)))
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[draft_ids] = True
        self.register_buffer("t2d", t2d)
        self.head_dim, self.rope_theta = hidden // heads, rope_theta

    def step(self, embeds: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """embeds, g [batch, seq, H] (positions 0..seq-1) → o [batch, seq, H], pre-norm."""
        cos, sin = rotary_cos_sin(torch.arange(embeds.shape[1]), self.head_dim, self.rope_theta)
        return self.midlayer(embeds, g, cos, sin)

    def draft_logits(self, o: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(o))


def aux_features(target, ids: torch.Tensor, layers=AUX_LAYERS) -> torch.Tensor:
    """ids [batch, seq] → the outputs of ``layers`` concatenated [batch, seq, len(layers)·H]
    (Hugging Face ``hidden_states[i + 1]`` is decoder layer i's output for i < L - 1)."""
    with torch.no_grad():
        states = target.model(input_ids=ids, output_hidden_states=True).hidden_states
    return torch.cat([states[i + 1] for i in layers], -1).float()


def draft_vocab(pool_ids: torch.Tensor, vocab: int, size: int) -> torch.Tensor:
    """The ``size`` most frequent token ids of the pool, ascending (ties: lower id first)."""
    counts = torch.bincount(pool_ids.flatten(), minlength=vocab).double()
    counts = counts - torch.arange(vocab, dtype=torch.float64) * 1e-9  # deterministic ties
    return counts.topk(size).indices.sort().values


def _soft_ce(draft_logits: torch.Tensor, teacher_logits: torch.Tensor, draft_ids: torch.Tensor) -> torch.Tensor:
    """EAGLE-3's token loss: the target's probabilities on the draft vocabulary (not renormalised)
    against the draft's log-probabilities, per position, averaged."""
    teacher = torch.softmax(teacher_logits.float(), -1)[..., draft_ids]
    return -(teacher * torch.log_softmax(draft_logits.float(), -1)).sum(-1).mean()


def train_eagle3(recipe, target, pool, progress) -> tuple[Eagle3Head, dict]:
    from pipeline.demo.models import lm_logits

    torch.manual_seed(recipe.seed + 9)
    ids, feats, is_generated = pool
    embed = target.model.embed_tokens.weight.detach()
    aux = torch.cat([aux_features(target, ids[s : s + 16]) for s in range(0, len(ids), 16)])
    draft_ids = draft_vocab(ids, recipe.vocab_size, recipe.eagle3_draft_vocab)
    head = Eagle3Head(recipe.hidden, recipe.heads, recipe.intermediate, 1e-5, 10000.0, draft_ids, recipe.vocab_size)
    for module in head.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
    head.lm_head.weight.data.copy_(embed[draft_ids])  # start from the target's (tied) LM head rows
    params = list(head.parameters())

    def loss_of(batch):
        rows, row_feats = batch
        row_ids = ids[rows]
        teacher = lm_logits(row_feats, embed)  # [batch, L, V]: position t predicts t+1

        def first():
            with autocast():
                g = head.fc(aux[rows][:, :-1])  # pair (g_t, x_{t+1}) predicts x_{t+2}
                o = head.step(embed[row_ids[:, 1:]], g)
            return o, _soft_ce(head.draft_logits(o.float()), teacher[:, 1:], draft_ids)

        def again(extra, o):  # pass p: inputs (own output o_{t+p-1}, x_{t+p})
            with autocast():
                o = head.step(embed[row_ids[:, 1 + extra :]], o[:, :-1])
            return o, _soft_ce(head.draft_logits(o.float()), teacher[:, 1 + extra :], draft_ids)

        return unrolled_loss(recipe.eagle3_unroll, first, again)

    batches = pool_batches((torch.arange(len(ids)), feats, is_generated), recipe.batch, recipe.eagle3_steps,
                           recipe.seed + 10)
    losses = train_loop(params, recipe.eagle3_lr, 0.0, recipe.warmup, recipe.eagle3_steps, batches,
                        "eagle3 (1 layer, 3 taps)", progress, loss_of)
    head.eval()
    return head, {"params": sum(p.numel() for p in head.parameters()), "draft_vocab_size": len(draft_ids),
                  "aux_layers": list(AUX_LAYERS), "final_loss": tail_mean(losses)}


def eagle3_config(target_config: dict, draft_vocab_size: int, base: str) -> dict:
    """Fields as upstream EAGLE-3 checkpoints' config.json (yuhuili/EAGLE3-LLaMA3.1-Instruct-8B:
    ``LlamaForCausalLMEagle3``, ``draft_vocab_size``, one hidden layer) plus the capture layers."""
    keys = (
        "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
        "rms_norm_eps", "rope_theta", "max_position_embeddings", "bos_token_id", "eos_token_id",
        "pad_token_id", "hidden_act",
    )
    config = {k: target_config[k] for k in keys if k in target_config}
    config.update(
        architectures=["LlamaForCausalLMEagle3"],
        model_type="llama",
        num_hidden_layers=1,
        draft_vocab_size=draft_vocab_size,
        target_hidden_size=target_config["hidden_size"],
        bias=False,
        tie_word_embeddings=False,
        torch_dtype="float32",
        base_model_name_or_path=base,
        eagle_config={"eagle_aux_hidden_state_layer_ids": list(AUX_LAYERS), "use_aux_hidden_state": True,
                      "layer_ids_meaning": "0-based decoder layer whose output (residual stream) is captured"},
    )
    return config


def save_eagle3(head: Eagle3Head, out_dir: Path, target_dir: Path, base: str) -> None:
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in head.state_dict().items()}
    save_file(state, str(out_dir / EAGLE3_WEIGHTS), metadata={"format": "pt"})
    target_config = json.loads((target_dir / "config.json").read_text())
    write_json(out_dir / "config.json", eagle3_config(target_config, head.lm_head.out_features, base))
    for path in out_dir.iterdir():
        path.chmod(0o644)
