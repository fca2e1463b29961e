"""Deterministic CPU training of the demo models: tokenizer, target, draft, Medusa heads, EAGLE-1
and EAGLE-3 heads (the latter in :mod:`pipeline.demo.eagle3`).

Reads nothing but the generated corpus (``corpus``); writes one checkpoint directory per builtin
under ``out_dir`` (``tiny-target``, ``tiny-draft``: HF Llama layout; ``tiny-medusa``, ``tiny-eagle``, ``tiny-eagle3``:
upstream head layouts, see ``heads``), ``SHA256SUMS.txt`` over every file, and ``training_report.json``
(losses, agreements, a greedy sample per category, seconds per stage). One torch thread, fixed
seeds, bf16 autocast with fp32 master weights (float32 throughout on a CPU without fast bf16,
head_training.autocast_mode): the same machine type gives bit-identical files.
Recipe (the usual small-LM one, and the one training loop every model here goes through:
:mod:`pipeline.demo.head_training`): AdamW β=(0.9, 0.95), wd 0.1, warm-up then cosine
to 10 %, grad-clip 1.0; the draft/heads learn from the target's distributions (KD) on half corpus
windows, half target-generated (on-policy) sequences.
"""

from __future__ import annotations

import json
import os
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from pipeline.demo import corpus, evaluate
from pipeline.demo.head_training import autocast, autocast_mode, pool_batches, tail_mean, train_loop, unrolled_loss
from pipeline.demo.models import (
    DRAFT,
    EAGLE,
    EAGLE3,
    MEDUSA,
    MODEL_NAMES,
    TARGET,
    generate_greedy_or_sampled,
    lm_logits,
    target_features,
)
from pipeline.demo.models import one_thread_torch as _torch
from pipeline.demo.saving import save_eagle, save_llama, save_medusa, write_sums
from pipeline.demo.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    load_tokenizer,
    save_tokenizer,
    train_tokenizer,
)

REPORT_FILE = "training_report.json"


@dataclass(frozen=True)
class Recipe:
    samples_per_category: int = 300
    vocab_size: int = 1024
    hidden: int = 256
    layers: int = 6
    heads: int = 4
    intermediate: int = 672
    max_positions: int = 512
    seq_len: int = 128
    batch: int = 8
    target_steps: int = 600
    target_lr: float = 2e-3
    warmup: int = 30
    draft_steps: int = 520
    draft_lr: float = 2e-3
    medusa_heads: int = 5
    medusa_steps: int = 420
    medusa_lr: float = 3e-3
    eagle_steps: int = 400
    eagle_lr: float = 4e-3  # 2e-3 left it undertrained: in-domain tau (chain of 5) 4.85 -> 5.10 (seed 99: 4.73 -> 4.83)
    eagle_noise: float = 0.05
    eagle_token_loss: float = 0.1  # weight of the KD term next to the feature loss
    eagle_unroll: int = 2  # passes; 2+ also feed the head its own predicted features, as drafting does
    eagle3_steps: int = 300
    eagle3_lr: float = 4e-3
    # passes = the draft depth: with no feature loss the head's own outputs drift from the
    # target's features, so a depth never unrolled in training is a depth it drafts badly at
    eagle3_unroll: int = 5
    eagle3_draft_vocab: int = 512  # the draft vocabulary: the pool's most frequent target tokens (d2t)
    pool_corpus_windows: int = 160
    pool_generated: int = 160
    gen_prompt_tokens: int = 16
    eval_prompts_per_category: int = 8
    eval_new_tokens: int = 48
    seed: int = 1234


FULL = Recipe()
SMOKE = Recipe(
    samples_per_category=40, target_steps=24, warmup=4, draft_steps=12, medusa_steps=12, eagle_steps=12,
    eagle3_steps=12,
    pool_corpus_windows=16, pool_generated=16, seq_len=64, eval_prompts_per_category=2, eval_new_tokens=8,
)


# ------------------------------------------------------------------------------------------------
# progress + schedule


class Progress:
    """Thin wrapper over rich progress bars (stderr); silent when ``enabled`` is False."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self._bar = None

    def __enter__(self) -> "Progress":
        if self.enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
            from rich.progress import Progress as Bar

            self._bar = Bar(
                TextColumn("{task.description:<22}"), BarColumn(), MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=Console(stderr=True),
            )
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def steps(self, label: str, total: int) -> Iterator[Callable[[str], None]]:
        """Yields ``total`` times an ``info(text)`` callback that also advances the bar."""
        task = self._bar.add_task(label, total=total, info="") if self._bar else None
        for _ in range(total):
            advanced = []

            def info(text: str = "") -> None:
                if self._bar is not None and not advanced:  # noqa: B023 - called only inside this iteration
                    self._bar.update(task, advance=1, info=text)
                    advanced.append(True)  # noqa: B023 - called only inside this iteration

            yield info
            info()


# ------------------------------------------------------------------------------------------------
# data


@dataclass
class Data:
    train_ids: list[int]  # the whole training stream: <s> doc </s> <s> doc </s> …
    train_docs: list[list[int]]
    heldout: dict[str, list[list[int]]]  # category → held-out prompts (token ids with <s>)
    tokenizer: object


def build_data(recipe: Recipe, out_dir: Path) -> Data:
    samples = corpus.training_corpus(recipe.samples_per_category)
    tokenizer = train_tokenizer([text for _, text in samples], recipe.vocab_size)
    save_tokenizer(tokenizer, out_dir / TARGET)
    return _encode_data(recipe, tokenizer, samples)


def _encode_data(recipe: Recipe, tokenizer, samples) -> Data:
    docs = [tokenizer.encode(text).ids + [EOS_ID] for _, text in samples]
    stream = [tok for doc in docs for tok in doc]
    heldout = {
        cat: [tokenizer.encode(p["prompt"]).ids for p in corpus.prompts(cat, recipe.eval_prompts_per_category, seed=corpus.HELDOUT_SEED + 1)]
        for cat in corpus.CATEGORIES
    }
    return Data(stream, docs, heldout, tokenizer)


def _windows(stream: list[int], count: int, length: int, generator):
    """``count`` random windows of ``length`` tokens from the stream → LongTensor [count, length]."""
    torch = _torch()
    ids = torch.tensor(stream, dtype=torch.long)
    starts = torch.randint(0, len(stream) - length, (count,), generator=generator)
    return torch.stack([ids[s : s + length] for s in starts.tolist()])


# ------------------------------------------------------------------------------------------------
# target + draft (HF Llama)


def llama_config(recipe: Recipe, layers: int):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=recipe.vocab_size, hidden_size=recipe.hidden, intermediate_size=recipe.intermediate,
        num_hidden_layers=layers, num_attention_heads=recipe.heads, num_key_value_heads=recipe.heads,
        max_position_embeddings=recipe.max_positions, rms_norm_eps=1e-5, rope_theta=10000.0,
        tie_word_embeddings=True, bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
    )


def train_target(recipe: Recipe, data: Data, progress: Progress) -> tuple[object, dict]:
    torch = _torch()
    from transformers import LlamaForCausalLM

    torch.manual_seed(recipe.seed)
    model = LlamaForCausalLM(llama_config(recipe, recipe.layers)).train()
    params = [p for p in model.parameters() if p.requires_grad]
    generator = torch.Generator().manual_seed(recipe.seed)
    batches = (_windows(data.train_ids, recipe.batch, recipe.seq_len + 1, generator) for _ in range(recipe.target_steps))

    def loss_of(batch):
        with autocast():
            logits = model(input_ids=batch[:, :-1]).logits
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, recipe.vocab_size), batch[:, 1:].reshape(-1))

    losses = train_loop(params, recipe.target_lr, 0.1, recipe.warmup, recipe.target_steps, batches,
                        "target (6 layers)", progress, loss_of)
    model.eval()
    return model, {"params": sum(p.numel() for p in model.parameters()), "final_train_loss": tail_mean(losses)}


def build_pool(recipe: Recipe, target, data: Data, progress: Progress):
    """Half corpus windows, half target-generated sequences (greedy and T=1), with the target's
    features → (ids [N, L], features [N, L, H], is_generated [N])."""
    torch = _torch()
    generator = torch.Generator().manual_seed(recipe.seed + 1)
    length = recipe.seq_len
    corpus_ids = _windows(data.train_ids, recipe.pool_corpus_windows, length, generator)
    rng = random.Random(recipe.seed)
    docs = [d for d in data.train_docs if len(d) > recipe.gen_prompt_tokens]
    prompts = torch.tensor([rng.choice(docs)[: recipe.gen_prompt_tokens] for _ in range(recipe.pool_generated)])
    new = length - recipe.gen_prompt_tokens
    generated, chunk = [], 32
    chunks = list(range(0, recipe.pool_generated, chunk))
    for index, (start, info) in enumerate(zip(chunks, progress.steps("on-policy sequences", len(chunks)))):
        sample = index % 2 == 1
        generated.append(generate_greedy_or_sampled(target, prompts[start : start + chunk], new, sample, generator))
        info("sampled T=1" if sample else "greedy")
    ids = torch.cat([corpus_ids] + generated)
    feats = []
    batches = list(range(0, len(ids), 16))
    for start, info in zip(batches, progress.steps("target features", len(batches))):
        feats.append(target_features(target, ids[start : start + 16]))
        info()
    is_generated = torch.cat([torch.zeros(len(corpus_ids), dtype=torch.bool), torch.ones(len(ids) - len(corpus_ids), dtype=torch.bool)])
    return ids, torch.cat(feats), is_generated


def kd_loss(student_logits, teacher_logits):
    """Forward KL(teacher ‖ student) per position, averaged over positions."""
    torch = _torch()
    log_q = torch.log_softmax(student_logits.float(), -1)
    log_p = torch.log_softmax(teacher_logits.float(), -1)
    return (log_p.exp() * (log_p - log_q)).sum(-1).mean()


def train_draft(recipe: Recipe, target, pool, progress: Progress) -> tuple[object, dict]:
    torch = _torch()
    from transformers import LlamaForCausalLM

    torch.manual_seed(recipe.seed + 2)
    draft = LlamaForCausalLM(llama_config(recipe, 1))
    draft.model.embed_tokens.weight.data.copy_(target.model.embed_tokens.weight.data)
    draft.model.norm.weight.data.copy_(target.model.norm.weight.data)
    draft.model.layers[0].load_state_dict(target.model.layers[0].state_dict())
    draft.train()
    params = [p for p in draft.parameters() if p.requires_grad]
    embed = target.model.embed_tokens.weight.detach()

    def loss_of(batch):
        ids, feats = batch
        with autocast():
            logits = draft(input_ids=ids).logits
        return kd_loss(logits, lm_logits(feats, embed))

    losses = train_loop(params, recipe.draft_lr, 0.1, recipe.warmup, recipe.draft_steps,
                        pool_batches(pool, recipe.batch, recipe.draft_steps, recipe.seed + 3),
                        "draft (1 layer, KD)", progress, loss_of, metric="KL")
    draft.eval()
    return draft, {"params": sum(p.numel() for p in draft.parameters()), "final_kl": tail_mean(losses)}


# ------------------------------------------------------------------------------------------------
# Medusa + EAGLE


def train_medusa(recipe: Recipe, target, pool, progress: Progress) -> tuple[object, dict]:
    torch = _torch()
    from pipeline.demo.heads import MedusaHeads

    torch.manual_seed(recipe.seed + 4)
    embed = target.model.embed_tokens.weight.detach()
    heads = MedusaHeads(recipe.medusa_heads, recipe.hidden, recipe.vocab_size)
    for head in heads.heads:
        head[1].weight.data.copy_(embed)
    params = list(heads.parameters())

    def loss_of(batch):
        _, feats = batch
        teacher = lm_logits(feats, embed)  # [batch, L, V]: position t predicts t+1
        with autocast():
            head_logits = heads(feats)  # [heads, batch, L, V]
        loss = 0.0
        for i in range(recipe.medusa_heads):
            # head i at position t predicts token t+2+i = the teacher's prediction at t+1+i
            loss = loss + (0.8**i) * kd_loss(head_logits[i, :, : -(1 + i)], teacher[:, 1 + i :])
        return loss

    losses = train_loop(params, recipe.medusa_lr, 0.0, recipe.warmup, recipe.medusa_steps,
                        pool_batches(pool, recipe.batch, recipe.medusa_steps, recipe.seed + 5),
                        f"medusa ({recipe.medusa_heads} heads, KD)", progress, loss_of)
    heads.eval()
    return heads, {"params": sum(p.numel() for p in heads.parameters()), "final_loss": tail_mean(losses)}


def _eagle_loss(recipe: Recipe, predicted, target_next, embed):
    """EAGLE's objective: smooth-L1 to the target's next feature + weighted KD on its logits."""
    torch = _torch()
    feature_loss = torch.nn.functional.smooth_l1_loss(predicted, target_next)
    return feature_loss + recipe.eagle_token_loss * kd_loss(lm_logits(predicted, embed), lm_logits(target_next, embed))


def train_eagle(recipe: Recipe, target, pool, progress: Progress) -> tuple[object, dict]:
    torch = _torch()
    from pipeline.demo.heads import EagleHead

    torch.manual_seed(recipe.seed + 6)
    embed = target.model.embed_tokens.weight.detach()
    head = EagleHead(recipe.hidden, recipe.heads, recipe.intermediate, recipe.vocab_size, 1e-5, 10000.0)
    for module in head.modules():
        if isinstance(module, torch.nn.Linear) and module is not head.fc:
            torch.nn.init.normal_(module.weight, std=0.02)
    with torch.no_grad():  # start as "next feature ≈ current feature"
        head.fc.weight.normal_(std=0.02)
        head.fc.weight[:, recipe.hidden :] += torch.eye(recipe.hidden)
        head.fc.bias.zero_()
    head.embed_tokens.weight.data.copy_(embed)
    head.embed_tokens.weight.requires_grad_(False)  # frozen copy of the target's, as upstream
    params = [p for p in head.parameters() if p.requires_grad]
    noise_gen = torch.Generator().manual_seed(recipe.seed + 7)

    def loss_of(batch):
        ids, feats = batch
        noisy = feats[:, :-1] + torch.randn(feats[:, :-1].shape, generator=noise_gen) * recipe.eagle_noise

        def first():
            with autocast():
                h = head(ids[:, 1:], noisy)  # [batch, L-1, H] ≈ f_{t+1}
            return h, _eagle_loss(recipe, h.float(), feats[:, 1:], embed)

        def again(extra, h):  # pass p: inputs (predicted f_{t+p-1}, x_{t+p})
            with autocast():
                h = head(ids[:, 1 + extra :], h[:, :-1].to(noisy.dtype))
            return h, _eagle_loss(recipe, h.float(), feats[:, 1 + extra :], embed)

        return unrolled_loss(recipe.eagle_unroll, first, again)

    losses = train_loop(params, recipe.eagle_lr, 0.0, recipe.warmup, recipe.eagle_steps,
                        pool_batches(pool, recipe.batch, recipe.eagle_steps, recipe.seed + 8),
                        "eagle (1 layer)", progress, loss_of)
    head.eval()
    trainable = sum(p.numel() for p in params)
    return head, {"params": sum(p.numel() for p in head.parameters()), "trainable_params": trainable, "final_loss": tail_mean(losses)}


# ------------------------------------------------------------------------------------------------
# saving


# ------------------------------------------------------------------------------------------------
# the whole recipe


class _SecondProcess:
    """EAGLE training in a spawned process on the second core while this one trains the draft
    and Medusa heads. Bit-identical to training it here: same seeds, one thread each, and the
    target's embeddings read back from the checkpoint just saved. The child saves the head into
    ``out_dir/tiny-eagle`` and sends back its report, its seconds and the evaluation's target
    continuations (see :func:`_eagle_child`); an error there is raised here."""

    def __init__(self, recipe: Recipe, pool, heldout: dict, out_dir: Path):
        import multiprocessing

        context = multiprocessing.get_context("spawn")  # no fork of a process holding torch threads
        self._receive, send = context.Pipe(duplex=False)
        self._process = context.Process(target=_eagle_child, args=(recipe, pool, heldout, str(out_dir), send),
                                        daemon=True)
        self._process.start()
        send.close()

    def join(self) -> tuple[dict, float, dict]:
        """(EAGLE report, its training seconds, the evaluation's target continuations)."""
        try:
            status, payload, seconds, continued = self._receive.recv()
        except EOFError:
            status, payload, seconds, continued = "error", "the EAGLE training process died", 0.0, None
        self._process.join()
        if status != "ok":
            raise RuntimeError(f"EAGLE training failed in its process: {payload}")
        torch = _torch()
        return payload, seconds, {c: [(torch.from_numpy(seq), torch.from_numpy(feats)) for seq, feats in rows]
                                  for c, rows in continued.items()}


def _eagle_child(recipe: Recipe, pool, heldout: dict, out_dir: str, send) -> None:
    """Train and save the EAGLE head, then (the other process is still busy with the draft and
    Medusa heads) the target's held-out continuations for :func:`evaluate.evaluate`."""
    import traceback

    try:
        _torch()
        from transformers import LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        started = time.perf_counter()
        target = LlamaForCausalLM.from_pretrained(str(Path(out_dir) / TARGET)).eval()
        head, info = train_eagle(recipe, target, pool, Progress(False))
        save_eagle(head, Path(out_dir) / EAGLE, Path(out_dir) / TARGET)
        seconds = round(time.perf_counter() - started, 1)
        continued = evaluate.continuations(target, heldout, recipe)
        # as numpy: tensors would travel as shared-memory handles, gone once this process exits
        send.send(("ok", info, seconds, {c: [(seq.numpy(), feats.numpy()) for seq, feats in rows]
                                         for c, rows in continued.items()}))
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises
        send.send(("error", traceback.format_exc(limit=5), 0.0, None))
    finally:
        send.close()


class _Laps:
    """Seconds per stage into ``report["seconds"]``."""

    def __init__(self, report: dict):
        self.report = report
        self.clock = time.perf_counter()

    def __call__(self, stage: str) -> None:
        now = time.perf_counter()
        self.report["seconds"][stage] = round(now - self.clock, 1)
        self.clock = now


def _target(out_dir: Path, recipe: Recipe, only: str | None, report: dict, lap: _Laps, progress: Progress):
    """The trained target and the data: reused from ``out_dir`` when retraining one head only."""
    from transformers import LlamaForCausalLM

    if only not in (None, TARGET) and (out_dir / TARGET / "model.safetensors").is_file():
        tokenizer = load_tokenizer(out_dir / TARGET)
        data = _encode_data(recipe, tokenizer, corpus.training_corpus(recipe.samples_per_category))
        target = LlamaForCausalLM.from_pretrained(str(out_dir / TARGET)).eval()
        lap("data")
    else:
        data = build_data(recipe, out_dir)
        lap("data")
        target, report["models"][TARGET] = train_target(recipe, data, progress)
        save_llama(target, out_dir / TARGET, None)
        lap("target")
    for p in target.parameters():
        p.requires_grad_(False)
    return target, data


def _heads(out_dir: Path, recipe: Recipe, only: str | None, parallel: bool, target, data: Data, report: dict,
           lap: _Laps, progress: Progress) -> tuple[dict, dict | None]:
    """Train and save the draft and heads (``only``: one of them); the EAGLE head in a second
    process when all train and ``parallel``. → (models by name, the held-out continuations the
    second process computed, or None)."""
    pool = build_pool(recipe, target, data, progress)
    lap("pool")
    beside = _SecondProcess(recipe, pool, data.heldout, out_dir) if parallel and only is None else None
    if beside is not None:
        report["parallel"] = [EAGLE]
    models, continued = {}, None
    from pipeline.demo.eagle3 import save_eagle3, train_eagle3

    trainers = ((DRAFT, train_draft), (MEDUSA, train_medusa), (EAGLE, train_eagle), (EAGLE3, train_eagle3))
    for name, trainer in trainers:
        if only in (None, name) and not (beside is not None and name == EAGLE):
            models[name], report["models"][name] = trainer(recipe, target, pool, progress)
            lap(name.removeprefix("tiny-"))
    if DRAFT in models:
        save_llama(models[DRAFT], out_dir / DRAFT, out_dir / TARGET)
    if MEDUSA in models:
        save_medusa(models[MEDUSA], out_dir / MEDUSA, recipe)
    if EAGLE in models:
        save_eagle(models[EAGLE], out_dir / EAGLE, out_dir / TARGET)
    if EAGLE3 in models:
        save_eagle3(models[EAGLE3], out_dir / EAGLE3, out_dir / TARGET, f"builtin:{TARGET}")
    if beside is not None:
        for _ in progress.steps("eagle (2nd process)", 1):
            report["models"][EAGLE], report["seconds"]["eagle"], continued = beside.join()
        from pipeline.demo.heads import load_eagle

        models[EAGLE] = load_eagle(out_dir / EAGLE).eval()
        lap("eagle_wait")
    return models, continued


def train_all(out_dir: Path, recipe: Recipe = FULL, only: str | None = None, show_progress: bool = True,
              parallel: bool = True) -> dict:
    """Train (all or ``only`` one of) the demo models into ``out_dir``; returns the report.
    ``parallel``: when all heads are trained, the EAGLE head trains in a second process meanwhile
    (same files either way; the report's ``parallel`` lists what ran beside the rest)."""
    torch = _torch()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    if only is not None and only not in MODEL_NAMES:
        raise ValueError(f"unknown demo model {only!r}")
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict = {"recipe": asdict(recipe), "torch": torch.__version__, "autocast": autocast_mode(), "seconds": {},
                    "models": {}}
    started = time.perf_counter()
    lap = _Laps(report)
    with Progress(show_progress) as progress:
        target, data = _target(out_dir, recipe, only, report, lap, progress)
        models, continued = {TARGET: target}, None
        if only != TARGET:
            heads, continued = _heads(out_dir, recipe, only, parallel, target, data, report, lap, progress)
            models.update(heads)
        report["quality"] = evaluate.evaluate(models, data, recipe, continued)
        lap("evaluate")
    report["total_seconds"] = round(time.perf_counter() - started, 1)  # wall clock (stages may overlap)
    report["sha256"] = write_sums(out_dir)
    if only is not None:
        report = _merge_into_previous(out_dir / REPORT_FILE, report)
    (out_dir / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
    (out_dir / REPORT_FILE).chmod(0o644)
    return report


def _merge_into_previous(path: Path, report: dict) -> dict:
    """A one-model retrain keeps the other models' figures from the previous report."""
    if not path.is_file():
        return report
    previous = json.loads(path.read_text())
    previous["recipe"] = report["recipe"]  # the recipe the files now come from
    previous["autocast"] = report["autocast"]
    previous["models"].update(report["models"])
    previous.setdefault("quality", {}).update(report.get("quality", {}))
    previous["sha256"] = report["sha256"]
    previous.setdefault("retrained", []).append({"models": sorted(report["models"]), "seconds": report["seconds"]})
    return previous


def default_threads_env() -> None:
    """One thread everywhere (set before torch is imported, for subprocess use)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS"):
        os.environ.setdefault(var, "1")
