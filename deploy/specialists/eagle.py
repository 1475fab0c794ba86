"""Train the EAGLE-3 head (actors/eagle_head.py) on the target's own answers: `specfleet train-eagle`, `make eagle`.

The recipe, in order:
1. **Corpus.** The target's greedy answers to broad requests (deploy/specialists/eagle_corpus.py: shards of
   token ids in the repository, less those sharing an 8-gram with an evaluation prompt), plus the
   answers to a user's own prompt files.
2. **Vocabulary.** The `vocabulary` most frequent answer tokens, EOS included. The report gives
   their coverage of the answers.
3. **Features.** One target forward per batch of sequences gives every position's fused feature
   (the hidden states entering the feature layers, [3H]) and its post-norm last hidden state [H],
   from which the target's distribution over the vocabulary is read. Both are kept in float16, in
   a cache file per corpus shard, so a resumed build does not run the target again and a new
   shard costs only its own forwards.
4. **Training-time test** (EAGLE-3). Step 0 reads the target's true features. Step j reads, at each
   pair, the head's own step j - 1 output of the pair before, with the true tokens. Its query at
   position t attends to the true pairs up to t - j and to its own chain (the step-i pair at
   t - j + i, i = 1..j), as when it drafts j + 1 tokens after the last verified one. The loss is
   sum_j DECAY^j * cross-entropy(target's distribution over the vocabulary, head) at the
   positions whose next-but-one token is an answer token in the vocabulary. There is no feature
   regression.
5. **Schedule and checkpoints.** AdamW with warm-up, then linear decay over `epochs`. A checkpoint
   every `checkpoint_s` seconds holds the head, optimizer, step and data order, so a build split
   into several runs of at most `max_minutes` each resumes where it stopped.
6. **Manifest.** Held-out agreement with the target by depth (step j's top-1 equals the target's, at
   answer positions of a tenth of the sequences held out), and counts and times.
"""
from __future__ import annotations

import math
import random
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from actors.eagle_head import EagleHead
from deploy.engine.target import TargetModel
from actors.task_corpus import Example

VOCABULARY = 24576  # head vocabulary size: 98.3% of plain decoding's tokens on the dev set (16,384: 97.1%; docs/experiments.md)
STEPS = 3  # training-time test: drafting steps unrolled
DECAY = 0.8  # loss weight of step j: DECAY ** j (EAGLE-3's)
FEATURE_BATCH_TOKENS = 4096  # padded positions per target forward of the feature pass
TRAIN_BATCH_TOKENS = 2048  # padded positions per training step
EPOCHS = 3  # over every shard: the 2-epoch head's loss was still falling (docs/experiments.md)
LR = 3e-3  # the earlier head's runs: 3e-3 agreed more than 1e-3 (docs/experiments.md)
HELDOUT = 0.05


@dataclass(frozen=True)
class Sequence_:
    """One example's token ids and the target's features at every position."""

    token_ids: torch.Tensor  # [L]
    fused: torch.Tensor  # [L, 3H] float16: hidden states entering the feature layers
    last: torch.Tensor  # [L, H] float16: the post-norm last hidden state (the target's logits read it)
    first_output: int  # index of the first answer token


def head_vocabulary(examples: Sequence[Example], eos_ids: Sequence[int], size: int, vocab_size: int) -> tuple[torch.Tensor, float]:
    """`size` token ids: the answers' tokens, most frequent first, then the lowest ids not among them
    (a byte-pair tokenizer numbers its merges in the order it learnt them, most frequent first); EOS
    always in. -> (ids, their share of the answers' tokens). The head reads its tokens through the
    target's frozen output rows, so a token the corpus never shows still gets the target's own row."""
    counts: dict[int, int] = {}
    for example in examples:
        for token in example.output_ids:
            counts[token] = counts.get(token, 0) + 1
    eos = sorted(int(e) for e in eos_ids)
    size = min(size, vocab_size)
    chosen = [t for t in sorted(counts, key=lambda t: -counts[t]) if t not in eos][: size - len(eos)]
    taken = set(chosen) | set(eos)
    chosen += [t for t in range(vocab_size) if t not in taken][: size - len(eos) - len(chosen)]
    total = sum(counts.values())
    covered = sum(counts.get(t, 0) for t in chosen + eos)
    return torch.tensor(chosen + eos, dtype=torch.long), covered / total if total else 0.0


def length_batches(lengths: Sequence[int], budget: int, rng: random.Random | None) -> list[list[int]]:
    """Indices of similar length together, at most `budget` padded positions a batch (shuffled when rng)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches, current = [], []
    for i in order:
        if current and lengths[i] * (len(current) + 1) > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    if rng is not None:
        rng.shuffle(batches)
    return batches


@torch.inference_mode()
def target_features(target: TargetModel, examples: Sequence[Example], progress: bool = False) -> list[Sequence_]:
    """Every position's fused feature and last hidden state, one target forward per batch; in the examples' order."""
    from tqdm import tqdm

    pad = min(target.eos_ids)
    out: list[Sequence_ | None] = [None] * len(examples)
    lengths = [len(e.token_ids) for e in examples]
    for batch in tqdm(length_batches(lengths, FEATURE_BATCH_TOKENS, None), desc="target features", disable=not progress):
        width = max(lengths[i] for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : lengths[i]], mask[row, : lengths[i]] = torch.tensor(examples[i].token_ids), 1
        outputs = target.model.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                     output_hidden_states=True)
        fused = target.fused_features(outputs).to(torch.float16).cpu()
        last = outputs.last_hidden_state.to(torch.float16).cpu()
        for row, i in enumerate(batch):
            n = lengths[i]
            out[i] = Sequence_(ids[row, :n].clone(), fused[row, :n].clone(), last[row, :n].clone(),
                               len(examples[i].prompt_ids))
    return out


def cached_features(target: TargetModel, examples: Sequence[Example], cache: Path | None,
                    progress: bool = False) -> list[Sequence_]:
    """target_features, kept in `cache` (a file) when given: a second build reads it back."""
    if cache is not None and cache.is_file():
        stored = torch.load(cache, weights_only=True)
        if stored["count"] == len(examples):
            return [Sequence_(*parts) for parts in zip(stored["tokens"], stored["fused"], stored["last"], stored["first"])]
    sequences = target_features(target, examples, progress)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(".partial")
        torch.save({"count": len(examples), "tokens": [s.token_ids for s in sequences], "fused": [s.fused for s in sequences],
                    "last": [s.last for s in sequences], "first": [s.first_output for s in sequences]}, partial)
        partial.replace(cache)
    return sequences


@dataclass(frozen=True)
class TrainBatch:
    tokens: torch.Tensor  # [B, T]: the pair at t holds x_{t+1}
    fused: torch.Tensor  # [B, T, 3H]: f_t
    labels: torch.Tensor  # [B, T, H]: the last hidden state at t + 1 (its distribution predicts x_{t+2})
    loss_mask: torch.Tensor  # [B, T] bool: x_{t+2} is an answer token in the vocabulary


def make_batch(items: Sequence[Sequence_], in_vocabulary: torch.Tensor) -> TrainBatch:
    """in_vocabulary [V] bool. Pairs t = 0 .. L - 3 of each sequence (x_{t+2} must exist), right-padded."""
    width = max(len(s.token_ids) for s in items) - 2
    b = len(items)
    hidden, fused_width = items[0].last.shape[1], items[0].fused.shape[1]
    tokens = torch.zeros((b, width), dtype=torch.long)
    fused = torch.zeros((b, width, fused_width), dtype=torch.float16)
    labels = torch.zeros((b, width, hidden), dtype=torch.float16)
    loss_mask = torch.zeros((b, width), dtype=torch.bool)
    for row, s in enumerate(items):
        n = len(s.token_ids) - 2
        tokens[row, :n] = s.token_ids[1 : n + 1]
        fused[row, :n] = s.fused[:n]
        labels[row, :n] = s.last[1 : n + 1]
        answer = torch.arange(n) + 2 >= s.first_output
        loss_mask[row, :n] = answer & in_vocabulary[s.token_ids[2 : n + 2]]
    return TrainBatch(tokens, fused, labels, loss_mask)


def _ttt_attention(q: torch.Tensor, keys: Sequence[torch.Tensor], values: Sequence[torch.Tensor], step: int) -> torch.Tensor:
    """Step `step`'s attention: q [B, h, T, d]; keys/values: steps 0..step, each [B, h, T, d].
    Query t sees step 0's keys at s <= t - step and step i's key at t - step + i (i = 1..step)."""
    t = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = [(q @ keys[0].transpose(-1, -2)) * scale]  # [B, h, T, T]
    limit = (torch.arange(t)[:, None] - step).clamp(min=0)  # a query with no true prefix sees key 0 (not in the loss)
    scores[0] = scores[0].masked_fill(torch.arange(t)[None, :] > limit, -math.inf)
    shifted_values = []
    for i in range(1, step + 1):
        shift = step - i
        k_i = torch.nn.functional.pad(keys[i], (0, 0, shift, 0))[:, :, :t]  # index t holds step i's key at t - shift
        v_i = torch.nn.functional.pad(values[i], (0, 0, shift, 0))[:, :, :t]
        scores.append(((q * k_i).sum(-1) * scale)[..., None])
        shifted_values.append(v_i)
    weights = torch.softmax(torch.cat(scores, dim=-1), dim=-1)
    out = weights[..., :t] @ values[0]
    for i, v_i in enumerate(shifted_values):
        out = out + weights[..., t + i : t + i + 1] * v_i
    return out


def ttt_loss(head: EagleHead, batch: TrainBatch, steps: int = STEPS) -> tuple[torch.Tensor, list[int], int]:
    """-> (loss, per step: loss positions where the head's top token is the target's, loss positions)."""
    device = head.fc.weight.device
    tokens, mask = batch.tokens.to(device), batch.loss_mask.to(device)
    positions = torch.arange(tokens.shape[1], device=device)[None].expand_as(tokens)
    with torch.no_grad():
        p = torch.softmax(batch.labels.to(device)[mask].float() @ head.head_weight.T, dim=-1)  # [N, V']
        target_top = p.argmax(-1)
    g = head.fused(batch.fused.to(device).float())
    keys: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    loss, agree, total_weight = 0.0, [], 0.0
    for step in range(steps):
        x, q, k, v = head.qkv(tokens, g, positions)
        keys.append(head.expand_kv(k))
        values.append(head.expand_kv(v))
        h = head.finish(x, _ttt_attention(q, keys, values, step))
        logits = head.logits(h[mask])
        weight = DECAY ** step
        loss = loss + weight * -(p * torch.log_softmax(logits, dim=-1)).sum(-1).mean()
        total_weight += weight
        agree.append(int((logits.argmax(-1) == target_top).sum()))
        g = torch.cat([h[:, :1], h[:, :-1]], dim=1)  # step j + 1's pair t reads step j's output at t - 1
    return loss / total_weight, agree, int(mask.sum())


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def train_eagle(
    target: TargetModel,
    examples: Sequence[Example],
    out_dir: Path,
    epochs: int = EPOCHS,
    lr: float = LR,
    vocabulary: int = VOCABULARY,
    steps: int = STEPS,
    seed: int = 0,
    heldout: float = HELDOUT,
    feature_cache: Path | None = None,
    sequences: Sequence[Sequence_] | None = None,
    features_s: float = 0.0,
    max_minutes: float | None = None,
    checkpoint: Path | None = None,
    checkpoint_s: float = 300.0,
    recipe: dict | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> dict | None:
    """Train (or resume training) the head; save it with its manifest in `out_dir` when done.
    `sequences`: the examples' features when the caller has them (else computed, kept in `feature_cache`),
    and `features_s` the seconds they took.
    -> the manifest, or None when `max_minutes` ran out first (the `checkpoint` file resumes it;
    default: beside out_dir)."""
    started = time.perf_counter()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    order = rng.sample(range(len(examples)), len(examples))
    cut = max(1, int(len(order) * heldout)) if heldout > 0 else 0
    heldout_ids, train_ids = order[:cut], order[cut:]
    head_ids, coverage = head_vocabulary([examples[i] for i in train_ids], sorted(target.eos_ids), vocabulary,
                                          target.vocab_size)
    if sequences is None:
        sequences = cached_features(target, examples, feature_cache, progress)
    features_s += time.perf_counter() - started
    in_vocabulary = torch.zeros(target.vocab_size, dtype=torch.bool)
    in_vocabulary[head_ids] = True
    head = EagleHead.from_target(target.model, head_ids)
    params = [p for p in head.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    lengths = [len(sequences[i].token_ids) for i in train_ids]
    per_epoch = len(length_batches(lengths, TRAIN_BATCH_TOKENS, None))
    total = max(1, epochs * per_epoch)
    warmup = min(200, total // 10 + 1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * max(0.0, 1 - s / total))
    checkpoint = checkpoint or out_dir.parent / f".{out_dir.name}.checkpoint.pt"
    state = {"step": 0, "losses": [], "train_s": 0.0, "features_s": 0.0}
    if checkpoint.is_file():
        saved = torch.load(checkpoint, weights_only=False)
        head.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        schedule.load_state_dict(saved["schedule"])
        state = {"features_s": 0.0} | saved["state"]
        if log:
            log(f"resumed at step {state['step']} of {total}")
    state["features_s"] += features_s  # every run's: the first computes the features, the others read them back
    plan = [batch for epoch in range(epochs) for batch in length_batches(lengths, TRAIN_BATCH_TOKENS, random.Random(seed + epoch))]
    head.train()
    last_saved = run_start = time.perf_counter()
    while state["step"] < total:
        batch = make_batch([sequences[train_ids[i]] for i in plan[state["step"]]], in_vocabulary)
        loss, _, _ = ttt_loss(head, batch, steps)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
        state["step"] += 1
        state["losses"].append(round(loss.item(), 4))
        now = time.perf_counter()
        if log and state["step"] % 50 == 0:
            log(f"step {state['step']}/{total}: loss {sum(state['losses'][-50:]) / 50:.4f} "
                f"({state['train_s'] + now - run_start:.0f} s training)")
        out_of_time = max_minutes is not None and now - started > 60 * max_minutes
        if now - last_saved > checkpoint_s or out_of_time:
            state["train_s"] += now - run_start
            run_start = last_saved = now
            checkpoint.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
                        "state": state}, checkpoint.with_suffix(".partial"))
            checkpoint.with_suffix(".partial").replace(checkpoint)
            if out_of_time:
                return None
    state["train_s"] += time.perf_counter() - run_start
    head.eval()
    agreement = heldout_agreement(head, [sequences[i] for i in heldout_ids], in_vocabulary, steps)
    positions = sum(len(examples[i].token_ids) for i in train_ids)
    per_epoch_losses = [sum(state["losses"][e * per_epoch : (e + 1) * per_epoch]) / per_epoch for e in range(epochs)]
    manifest = {
        "target": target.name, "recipe": (recipe or {}) | {"epochs": epochs, "lr": lr, "vocabulary": vocabulary,
                                                           "ttt_steps": steps, "decay": DECAY, "batch_tokens": TRAIN_BATCH_TOKENS},
        "seed": seed, "commit": git_commit(), "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "examples": len(train_ids), "heldout_examples": len(heldout_ids), "positions": positions,
        "vocabulary_coverage": round(coverage, 4), "epoch_losses": [round(x, 4) for x in per_epoch_losses],
        "heldout_agreement_by_depth": [round(a, 4) for a in agreement], "steps": total,
        "features_s": round(state["features_s"], 1), "train_s": round(state["train_s"], 1),
    }
    head.save(out_dir, manifest)
    checkpoint.unlink(missing_ok=True)
    return manifest


@torch.no_grad()
def heldout_agreement(head: EagleHead, sequences: Sequence[Sequence_], in_vocabulary: torch.Tensor,
                      steps: int = STEPS) -> list[float]:
    """Per drafting depth, the share of held-out answer positions where the head's top token is the target's."""
    agree, counted = [0] * steps, 0
    for batch in length_batches([len(s.token_ids) for s in sequences], TRAIN_BATCH_TOKENS, None):
        _, a, c = ttt_loss(head, make_batch([sequences[i] for i in batch], in_vocabulary), steps)
        agree, counted = [x + y for x, y in zip(agree, a)], counted + c
    return [a / counted if counted else 0.0 for a in agree]


def build_eagle(target: TargetModel, out_dir: Path, shards: Sequence[int] | None = None, prompt_files: Sequence[Path] = (),
                corpus_dir: Path | None = None, max_new_tokens: int = 192, epochs: int = EPOCHS, vocabulary: int = VOCABULARY,
                steps: int = STEPS, lr: float = LR, max_minutes: float | None = None, progress: bool = True) -> dict | None:
    """The head for `target` from the recipe: the corpus shards (all in `corpus_dir` by default), the
    target's answers to `prompt_files`, features cached per shard beside the checkpoint (so adding a
    shard computes only its own), training.
    -> the manifest (the head is saved in `out_dir`), or None when `max_minutes` ran out (run it again to resume)."""
    from actors.eagle_head import eagle_dir
    from actors.models import cache_root
    from deploy.bench.prompts import load_prompts
    from deploy.specialists.corpus import target_outputs
    from deploy.specialists.eagle_corpus import CORPUS_DIR, load_corpus, shard_indices

    log = print if progress else None
    corpus_dir = corpus_dir or CORPUS_DIR
    work = cache_root() / "eagle-work" / eagle_dir(target.name).name  # features and checkpoints: large, never in git
    started = time.perf_counter()
    examples: list[Example] = []
    sequences: list[Sequence_] = []
    corpus: dict = {"shards": 0, "requests": 0, "dropped_overlap": 0, "positions": 0, "by_style": {}}
    for shard in shard_indices(corpus_dir) if shards is None else shards:
        if max_minutes is not None and time.perf_counter() - started > 60 * max_minutes:
            return None  # the features cached so far stay: the next run goes on from the next shard
        shard_examples, counts = load_corpus(target, corpus_dir, [shard])
        for key in ("shards", "requests", "dropped_overlap", "positions"):
            corpus[key] += counts[key]
        for style, n in counts["by_style"].items():
            corpus["by_style"][style] = corpus["by_style"].get(style, 0) + n
        examples += shard_examples
        sequences += cached_features(target, shard_examples, work / f"features-shard-{shard:03d}-{len(shard_examples)}.pt",
                                     progress)
    for prompt_file in prompt_files:
        prompts = [p.messages if p.messages else [{"role": "user", "content": p.prompt}] for p in load_prompts(prompt_file)]
        answers = target_outputs(target, prompts, max_new_tokens, progress=progress)
        examples += answers
        sequences += cached_features(target, answers, work / f"features-{prompt_file.stem}-{len(answers)}-{max_new_tokens}.pt",
                                     progress)
    if not examples:
        raise ValueError(f"no corpus: no shard in {corpus_dir} and no prompt file (specfleet eagle-corpus)")
    if log:
        log(f"corpus: {len(examples)} examples, {corpus['positions']} corpus positions; features in "
            f"{time.perf_counter() - started:.0f} s")
    recipe = {"corpus": corpus, "prompt_files": [str(p) for p in prompt_files]}
    key = f"{len(examples)}-{sum(len(e.token_ids) for e in examples)}"
    features_s = time.perf_counter() - started
    left = None if max_minutes is None else max_minutes - features_s / 60
    return train_eagle(target, examples, out_dir, epochs=epochs, lr=lr, vocabulary=vocabulary, steps=steps,
                       sequences=sequences, features_s=features_s, max_minutes=left,
                       checkpoint=work / f"checkpoint-{key}-{epochs}-{vocabulary}-{steps}-{lr}.pt", recipe=recipe, log=log,
                       progress=progress)
