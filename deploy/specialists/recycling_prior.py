"""The recycling drafter's prior: the target's own predictions over a corpus, as a shipped table.

`build_prior(target, examples)` runs the target over each example (prompt + answer; the eagle
corpus in the repository holds the embedded target's own greedy answers to broad requests) and,
at every position with input token a, adds the probability of each of the k' = 2k most likely
next tokens b to mass[a, b]. Row a of the prior is then the k tokens with the most mass, each
with its mean probability (mass / positions of a): the target's context-free expectation of what
follows a, smoothed over every context the corpus shows (the online overlay, by contrast, keeps
each token's latest context). Tokens the corpus never shows get no row (EMPTY).

`write_prior(...)` saves `table.safetensors` (ids int32, probs float16: about 2.3 MB for a
49,152-token vocabulary at k = 8) and `manifest.json`: the target, a SHA-256 of its weights and of
its tokenizer, k, the corpus (shards, requests, positions), the build's seconds and time. The
embedded target's prior ships in actors/data/recycling/; `specfleet recycling-prior --model M`
builds one for another target (under $SPECFLEET_CACHE/recycling/, found before the shipped one).
"""
from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import torch

from actors.recycling_table import EMPTY, TOP_K, Prior
from deploy.engine.target import TargetModel
from actors.task_corpus import Example
from deploy.specialists.eagle import length_batches

BATCH_TOKENS = 4096  # positions per target forward
PROJECTION_ROWS = 1024  # positions per vocabulary projection (bounds the logits held at once)


def weights_sha256(model: torch.nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def tokenizer_sha256(tokenizer) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = backend.to_str() if backend is not None else repr(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode()).hexdigest()


@torch.inference_mode()
def build_prior(target: TargetModel, examples: Sequence[Example], k: int = TOP_K, progress: bool = False) -> tuple[Prior, int]:
    """-> (the prior: each token's k most likely successors by the target's summed probability
    over the corpus, with their mean probability; the positions read)."""
    from tqdm import tqdm

    vocab = int(target.model.get_output_embeddings().weight.shape[0])
    wide = 2 * k  # candidates summed per position: a token ranked k+1 here can lead over many contexts
    sources, successors, masses = [], [], []
    pad = min(target.eos_ids)
    lengths = [len(e.token_ids) for e in examples]
    positions = 0
    for batch in tqdm(length_batches(lengths, BATCH_TOKENS, None), desc="recycling prior", disable=not progress):
        width = max(lengths[i] for i in batch)
        ids = torch.full((len(batch), width), pad, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, : lengths[i]], mask[row, : lengths[i]] = torch.tensor(examples[i].token_ids), 1
        hidden = target.model.model(input_ids=ids.to(target.device), attention_mask=mask.to(target.device)).last_hidden_state
        kept = mask.bool()
        hidden, inputs = hidden[kept.to(hidden.device)], ids[kept]  # [n, H], [n]
        for start in range(0, len(inputs), PROJECTION_ROWS):
            logits = target.model.get_output_embeddings()(hidden[start : start + PROJECTION_ROWS]).float()
            top = torch.topk(logits, wide, dim=-1)
            probs = (top.values - torch.logsumexp(logits, dim=-1, keepdim=True)).exp().cpu()
            chunk = inputs[start : start + PROJECTION_ROWS]
            sources.append(chunk[:, None].expand(-1, wide).reshape(-1).numpy())
            successors.append(top.indices.cpu().reshape(-1).numpy())
            masses.append(probs.reshape(-1).numpy())
        positions += int(kept.sum())
    source, successor, mass = np.concatenate(sources), np.concatenate(successors), np.concatenate(masses)
    counts = np.bincount(source[::wide], minlength=vocab)  # positions of each input token
    pair, inverse = np.unique(source.astype(np.int64) * vocab + successor, return_inverse=True)
    summed = np.bincount(inverse, weights=mass)
    pair_source, pair_successor = pair // vocab, pair % vocab
    order = np.lexsort((-summed, pair_source))  # by source, most mass first
    ids = np.full((vocab, k), EMPTY, dtype=np.int32)
    probs = np.zeros((vocab, k), dtype=np.float32)
    starts = np.searchsorted(pair_source[order], np.arange(vocab))
    ends = np.searchsorted(pair_source[order], np.arange(vocab), side="right")
    for token in np.flatnonzero(ends > starts):
        chosen = order[starts[token] : min(ends[token], starts[token] + k)]
        ids[token, : len(chosen)] = pair_successor[chosen]
        probs[token, : len(chosen)] = summed[chosen] / counts[token]
    return Prior(ids, probs, {}), positions


def write_prior(target: TargetModel, name: str, examples: Sequence[Example], corpus: dict, out: Path,
                k: int = TOP_K, progress: bool = False) -> dict:
    """Build the prior and save it with its manifest under `out`. -> the manifest."""
    from actors.recycling_table import save_prior

    started = time.perf_counter()
    prior, positions = build_prior(target, examples, k, progress)
    manifest = {
        "target": name, "model_sha256": weights_sha256(target.model), "tokenizer_sha256": tokenizer_sha256(target.tokenizer),
        "k": k, "vocabulary": prior.vocab_size, "rows": int((prior.ids[:, 0] != EMPTY).sum()),
        "corpus": corpus | {"examples": len(examples), "positions_read": positions},
        "rule": "per input token, the k successors with the most summed probability over the corpus (top 2k per position)",
        "build_s": round(time.perf_counter() - started, 1),
        "built": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    save_prior(Prior(prior.ids, prior.probs, manifest), out)
    return manifest
