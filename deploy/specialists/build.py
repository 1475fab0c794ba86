"""Build the specialist pool: per task a target-output corpus, a retrieval datastore and a distilled drafter.

`build_specialists(target, tasks)` (what `specfleet specialists` / `make specialists` runs) reads
each task's training prompts (deploy/prompts/train/<task>.jsonl), asks the target for its greedy
answers (the corpus, `corpus.jsonl`), builds `datastore.npz` from the corpus (plus the Python
standard library's sources for `code`) and distils `distill/` from the corpus, all under
actors/specialists.specialists_root(). A task's corpus is reused when present; a task already
built (datastore and drafter present) is kept unless `rebuild`. The manifest (`manifest.json`)
records what was built and how long each step took on this machine. With `other_vocab`, the
build also makes the drafter of another vocabulary (deploy/specialists/other_vocab.py) from the
eagle corpus's answers, under specialists/othervocab/.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from actors.models import load_causal_lm, truncate_layers
from actors.retrieval import TokenDatastore
from actors.specialists import DATASTORE_FILE, DISTILL_DIR, MANIFEST_FILE, OTHER_VOCAB, OTHER_VOCAB_EXAMPLES, specialists_root
from deploy.bench.prompts import load_prompts
from deploy.engine.target import TargetModel
from deploy.specialists.corpus import Example, load_examples, python_sources, save_examples, target_outputs
from deploy.specialists.distill import distill

TRAIN_PROMPTS = Path(__file__).resolve().parent.parent / "prompts" / "train"
CORPUS_FILE = "corpus.jsonl"
CODE_STDLIB_CHARS = 2_000_000  # standard-library text added to the code datastore


def corpus_for(target: TargetModel, prompts_file: Path, path: Path, max_new_tokens: int, progress: bool) -> list[Example]:
    """The target's answers to the prompts in prompts_file, cached at path."""
    if path.is_file():
        return load_examples(path)
    prompts = [p.messages for p in load_prompts(prompts_file)]
    examples = target_outputs(target, prompts, max_new_tokens=max_new_tokens, progress=progress)
    save_examples(examples, path)
    return examples


def build_datastore(target: TargetModel, task: str, examples: Sequence[Example], path: Path) -> TokenDatastore:
    sequences = [e.token_ids for e in examples]
    if task == "code":
        sequences += [target.tokenizer(text, add_special_tokens=False)["input_ids"] for text in python_sources(CODE_STDLIB_CHARS)]
    datastore = TokenDatastore.build(sequences)
    datastore.save(path)
    return datastore


def build_distilled(target: TargetModel, examples: Sequence[Example], out_dir: Path, num_layers: int, epochs: int,
                    log: Callable[[str], None] | None = None) -> dict:
    base = load_causal_lm(target.name, device="cpu").model  # a fresh copy: training changes it
    truncate_layers(base, num_layers)
    pad = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else min(target.eos_ids)
    model, report = distill(base, examples, target.eos_ids, pad, epochs=epochs, log=log)
    meta = report.to_dict() | {"target": target.name}
    model.save(out_dir, meta)
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
        if not rebuild and task in manifest["tasks"] and (task_dir / DATASTORE_FILE).is_file() and (task_dir / DISTILL_DIR).is_dir():
            if log:
                log(f"{task}: already built (--rebuild to build it again)")
            continue
        task_start = step = time.perf_counter()
        examples = corpus_for(target, TRAIN_PROMPTS / f"{task}.jsonl", task_dir / CORPUS_FILE, max_new_tokens, progress)
        corpus_s = time.perf_counter() - step
        step = time.perf_counter()
        datastore = build_datastore(target, task, examples, task_dir / DATASTORE_FILE)
        datastore_s = time.perf_counter() - step
        if log:
            log(f"{task}: corpus {len(examples)} answers, datastore {len(datastore)} tokens")
        distilled = build_distilled(target, examples, task_dir / DISTILL_DIR, num_layers, epochs, log)
        manifest["tasks"][task] = {
            "prompts": len(examples), "output_tokens": sum(len(e.output_ids) for e in examples),
            "corpus_s": round(corpus_s, 1), "datastore_tokens": len(datastore), "datastore_s": round(datastore_s, 1),
            "distill": distilled,  # its train_s is the distillation's time
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
