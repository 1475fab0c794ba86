"""Build the specialist pool: per task a target-output corpus (what its retrieval drafter draws on) and a distilled drafter.

`build_specialists(target, tasks)` (what `specfleet specialists` / `make specialists` runs) reads
each task's training prompts (deploy/prompts/train/<task>.jsonl), asks the target for its greedy
answers (the corpus, `corpus.npz`, token ids; the retrieval drafter builds its datastore from it
when it loads) and distils `distill/` from the corpus (saved as its difference from the target),
all under `root` (default actors/specialists.specialists_root(); the repository's shipped copy
is such a build, written with `--out`). A task's corpus is reused when present; a task already
built (corpus and drafter present) is kept unless `rebuild`. The manifest (`manifest.json`)
records what was built, its sizes and how long each step took on this machine. With
`other_vocab`, the build also makes the drafter of another vocabulary
(deploy/specialists/other_vocab.py) from the eagle corpus's answers, under specialists/othervocab/.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from actors.distilled import is_distilled_dir
from actors.models import load_causal_lm, truncate_layers
from actors.specialists import CORPUS_FILE, DISTILL_DIR, MANIFEST_FILE, OTHER_VOCAB, OTHER_VOCAB_EXAMPLES, specialists_root
from actors.task_corpus import Example, load_corpus, save_corpus
from deploy.bench.prompts import load_prompts
from deploy.engine.target import TargetModel
from deploy.specialists.corpus import target_outputs
from deploy.specialists.distill import distill

TRAIN_PROMPTS = Path(__file__).resolve().parent.parent / "prompts" / "train"


def corpus_for(target: TargetModel, prompts_file: Path, path: Path, max_new_tokens: int, progress: bool) -> list[Example]:
    """The target's answers to the prompts in prompts_file, cached at path."""
    if path.is_file():
        return load_corpus(path)
    prompts = [p.messages for p in load_prompts(prompts_file)]
    examples = target_outputs(target, prompts, max_new_tokens=max_new_tokens, progress=progress)
    save_corpus(examples, path)
    return examples


def build_distilled(target: TargetModel, examples: Sequence[Example], out_dir: Path, num_layers: int, epochs: int,
                    log: Callable[[str], None] | None = None) -> dict:
    base = load_causal_lm(target.name, device="cpu").model  # a fresh copy: training changes it
    truncate_layers(base, num_layers)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(target.eos_ids)
    model, report, deltas = distill(base, examples, target.eos_ids, pad, epochs=epochs, log=log)
    meta = report.to_dict() | {"target": target.name}
    model.save(out_dir, meta, deltas)
    return meta


def build_specialists(
    target: TargetModel, tasks: Sequence[str], num_layers: int = 2, epochs: int = 8, max_new_tokens: int = 128,
    root: Path | None = None, progress: bool = True, rebuild: bool = False, other_vocab: bool = False,
) -> dict:
    root = root or specialists_root()
    log = print if progress else None
    manifest_path = root / MANIFEST_FILE
    manifest: dict = json.loads(manifest_path.read_text()) if manifest_path.is_file() and not rebuild else {}
    manifest = {"target": target.name, "tasks": manifest.get("tasks", {})} | (
        {OTHER_VOCAB: manifest[OTHER_VOCAB]} if OTHER_VOCAB in manifest else {})
    started = time.perf_counter()
    for task in tasks:
        task_dir = root / task
        if not rebuild and task in manifest["tasks"] and (task_dir / CORPUS_FILE).is_file() and is_distilled_dir(task_dir / DISTILL_DIR):
            if log:
                log(f"{task}: already built (--rebuild to build it again)")
            continue
        task_start = step = time.perf_counter()
        examples = corpus_for(target, TRAIN_PROMPTS / f"{task}.jsonl", task_dir / CORPUS_FILE, max_new_tokens, progress)
        corpus_s = time.perf_counter() - step
        if log:
            log(f"{task}: corpus {len(examples)} answers, {sum(len(e.token_ids) for e in examples)} tokens")
        distilled = build_distilled(target, examples, task_dir / DISTILL_DIR, num_layers, epochs, log)
        manifest["tasks"][task] = {
            "prompts": len(examples), "output_tokens": sum(len(e.output_ids) for e in examples),
            "corpus_tokens": sum(len(e.token_ids) for e in examples), "corpus_s": round(corpus_s, 1),
            "distill": distilled,  # its train_s is the distillation's time
            "bytes": sum(f.stat().st_size for f in task_dir.rglob("*") if f.is_file()),
        }
        manifest["tasks"][task]["build_s"] = round(time.perf_counter() - task_start, 1)
    other_dir = root / OTHER_VOCAB
    if other_vocab and (rebuild or not (other_dir / "build.json").is_file()):
        from deploy.specialists.eagle_corpus import load_corpus
        from deploy.specialists.other_vocab import build_other_vocab

        step = time.perf_counter()
        examples = load_corpus(target)[0][:OTHER_VOCAB_EXAMPLES]
        manifest[OTHER_VOCAB] = build_other_vocab(target, examples, other_dir, log=log)
        manifest[OTHER_VOCAB]["build_s"] = round(time.perf_counter() - step, 1)
    elif other_vocab and log:
        log(f"{OTHER_VOCAB}: already built (--rebuild to build it again)")
    manifest["build_s"] = round(sum(t["build_s"] for t in manifest["tasks"].values())
                                + manifest.get(OTHER_VOCAB, {}).get("build_s", 0.0), 1)
    manifest["this_run_s"] = round(time.perf_counter() - started, 1)
    root.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(manifest, indent=1))
    return manifest
