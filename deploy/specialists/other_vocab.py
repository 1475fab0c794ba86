"""A drafter of another model family, built here from the target: its own tokenizer, its own vocabulary.

Users want the small model of another family they already have to draft for their target
(actors/cross_vocab.py). To test that path without a download, `build_other_vocab` makes one:

1. a byte-level BPE tokenizer of `vocabulary` tokens (8,192 by default; the target's has 49,152)
   trained with `tokenizers` on the text of the target's own answers (the eagle corpus shards,
   deploy/specialists/eagle_corpus.py), the target's special tokens kept whole;
2. a 2-layer LM over it, the size of a distilled specialist: the target's config with its own
   vocabulary, the target's first layers and final norm, each new token's embedding the mean of
   the target's embeddings of the target tokens that spell it (tied to the head);
3. trained (every weight) on the target's answers re-tokenized with the new tokenizer: next-token
   cross-entropy on the answers' positions, for `epochs` or `max_minutes`, whichever ends first.

A tenth of the examples is held out: the report gives the held-out share of answer text the
drafter predicts token by token (its top-1 agreement with the answer in its own tokens). Saved as
a transformers directory with its tokenizer under specialists_root()/othervocab/ (actors/specialists.py).
"""
from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from actors.task_corpus import Example
from deploy.specialists.training import train as train_epochs

VOCABULARY = 8192
NUM_LAYERS = 2
MAX_PROMPT = 128  # tokens of a prompt's tail an example keeps (the answers carry the loss)
IGNORE = -100


@dataclass(frozen=True)
class OtherVocabReport:
    vocabulary: int
    num_layers: int
    examples: int
    steps: int
    first_epoch_loss: float
    last_epoch_loss: float
    heldout_agreement: float
    tokenizer_s: float
    train_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def train_tokenizer(texts: Sequence[str], vocabulary: int, special_tokens: Sequence[str], eos_token: str):
    """A byte-level BPE over `texts` (transformers' fast tokenizer), special tokens kept whole."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocabulary, special_tokens=list(special_tokens), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=eos_token, pad_token=special_tokens[0],
                                   additional_special_tokens=[t for t in special_tokens if t not in (eos_token, special_tokens[0])])


def spelled_embeddings(tokenizer, target_tokenizer, target_embeddings: torch.Tensor) -> torch.Tensor:
    """Per new token, the mean of the target's embeddings of the target tokens that spell it
    (both tokenizers are byte-level: a token's string is its bytes in the same alphabet)."""
    special = set(tokenizer.all_special_tokens)
    target_vocab = target_tokenizer.get_vocab()
    target_bpe = target_tokenizer.backend_tokenizer.model
    rows = torch.empty(len(tokenizer), target_embeddings.shape[1])
    for piece, index in tokenizer.get_vocab().items():
        if piece in special and piece in target_vocab:
            ids = [target_vocab[piece]]
        else:
            ids = [t.id for t in target_bpe.tokenize(piece)] or [target_tokenizer.eos_token_id]
        rows[index] = target_embeddings[ids].mean(0)
    return rows


def new_model(target_model: torch.nn.Module, tokenizer, target_tokenizer, num_layers: int) -> torch.nn.Module:
    """The target's config with the new vocabulary and `num_layers` layers, started from the target's weights."""
    from transformers import AutoModelForCausalLM

    config = target_model.config.__class__.from_dict(target_model.config.to_dict())
    config.vocab_size, config.num_hidden_layers, config.tie_word_embeddings = len(tokenizer), num_layers, True
    config.bos_token_id = config.eos_token_id = tokenizer.eos_token_id
    config.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model = AutoModelForCausalLM.from_config(config)
    state = {k: v for k, v in target_model.state_dict().items()
             if not k.startswith(("model.embed_tokens", "lm_head")) and _layer(k) < num_layers}
    model.load_state_dict(state, strict=False)
    spelled = spelled_embeddings(tokenizer, target_tokenizer, target_model.get_input_embeddings().weight)
    with torch.no_grad():
        model.get_input_embeddings().weight.copy_(spelled)
    model.tie_weights()
    return model


def _layer(key: str) -> int:
    parts = key.split(".")
    return int(parts[parts.index("layers") + 1]) if "layers" in parts else -1


def retokenized(examples: Sequence[Example], decode: Callable[[Sequence[int]], str], tokenizer) -> list[tuple[list[int], int]]:
    """Each example as (the new tokenizer's ids of the prompt's last MAX_PROMPT tokens + the answer
    + end of text, where the answer starts)."""
    out = []
    for example in examples:
        prompt = tokenizer.encode(decode(example.prompt_ids), add_special_tokens=False)[-MAX_PROMPT:]
        answer = tokenizer.encode(decode(example.output_ids), add_special_tokens=False) + [tokenizer.eos_token_id]
        out.append((prompt + answer, len(prompt)))
    return out


def _batch(rows: Sequence[tuple[list[int], int]], pad: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for row, (seq, answer_start) in enumerate(rows):
        ids[row, : len(seq)], mask[row, : len(seq)] = torch.tensor(seq), 1
        labels[row, answer_start : len(seq)] = torch.tensor(seq[answer_start:])
    return ids, mask, labels


def _loss(model: torch.nn.Module, batch) -> tuple[torch.Tensor, int, int]:
    ids, mask, labels = batch
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    target = labels[:, 1:]
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=IGNORE)
    counted = target != IGNORE
    return loss, int(((logits.argmax(-1) == target) & counted).sum()), int(counted.sum())


def build_other_vocab(target, examples: Sequence[Example], out_dir: Path, vocabulary: int = VOCABULARY,
                      num_layers: int = NUM_LAYERS, epochs: int = 1, max_minutes: float = 15.0, batch_size: int = 8,
                      lr: float = 2e-3, seed: int = 0, log: Callable[[str], None] | None = None) -> dict:
    """target: a TargetModel (its model, tokenizer and decode). -> the manifest written beside the model."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    shuffled = rng.sample(list(examples), len(examples))
    heldout, train = shuffled[: max(1, len(shuffled) // 10)], shuffled[max(1, len(shuffled) // 10):]
    decode = lambda ids: target.tokenizer.decode(list(ids), skip_special_tokens=False)  # noqa: E731
    start = time.perf_counter()
    special = list(target.tokenizer.all_special_tokens)
    eos = target.tokenizer.decode([min(target.eos_ids)]) if target.tokenizer.eos_token is None else target.tokenizer.eos_token
    tokenizer = train_tokenizer([decode(e.token_ids) for e in train], vocabulary, special, eos)
    tokenizer_s = time.perf_counter() - start
    model = new_model(target.model, tokenizer, target.tokenizer, num_layers)
    rows, held = retokenized(train, decode, tokenizer), retokenized(heldout, decode, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    steps_per_epoch = math.ceil(len(rows) / batch_size)
    deadline = start + 60 * max_minutes
    model.train()

    def epoch_batches():
        order = rng.sample(rows, len(rows))
        for i in range(0, len(order), batch_size):
            if time.perf_counter() > deadline:
                return
            yield order[i : i + batch_size]

    steps = [0]

    def loss_of(batch):
        steps[0] += 1
        return _loss(model, _batch(batch, pad))[0]

    train_start = time.perf_counter()
    losses = train_epochs([p for p in model.parameters() if p.requires_grad], epochs, steps_per_epoch, epoch_batches,
                          loss_of, lr, warmup=20, log=log)
    train_s = time.perf_counter() - train_start
    model.eval()
    agree = counted = 0
    with torch.no_grad():
        for i in range(0, len(held), batch_size):
            _, a, c = _loss(model, _batch(held[i : i + batch_size], pad))
            agree, counted = agree + a, counted + c
    report = OtherVocabReport(vocabulary=len(tokenizer), num_layers=num_layers, examples=len(rows), steps=steps[0],
                              first_epoch_loss=round(losses[0], 4), last_epoch_loss=round(losses[-1], 4),
                              heldout_agreement=round(agree / max(counted, 1), 4), tokenizer_s=round(tokenizer_s, 1),
                              train_s=round(train_s, 1))
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    meta = report.to_dict() | {"target": target.name}
    (out_dir / "build.json").write_text(json.dumps(meta, indent=1))
    return meta
