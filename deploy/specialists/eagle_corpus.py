"""The eagle head's corpus: the target's own greedy answers to broad requests, in shards kept in the repository.

`generate_shard(scheduler, jobs, max_new_tokens)` answers a shard's jobs (deploy/specialists/eagle_prompts.py)
through the project's own continuous-batching scheduler (deploy/engine/scheduler.py). Every request is in
flight at once, up to the scheduler's batch, and a chained job's second request joins the batch as
soon as its first answer is done. The answers are greedy and lossless, so they are exactly the
target's plain greedy answers whatever the drafts.
-> one `CorpusRecord` per request: the job's id and style, the stage, the prompt's token ids as the
engine encodes the request, and the answer's token ids (EOS, when it came, included).

`build_shards(target, shards, out_dir)` writes shard i as `shard-<i>.jsonl.gz`: jobs
[i * SHARD_JOBS, (i + 1) * SHARD_JOBS) of `compose_jobs`. A shard file is written whole, through
a temporary file, so an interrupted build resumes at the first missing shard. A shard of 256 jobs
takes about 10 minutes on two CPU cores. `load_corpus(dir)` reads every shard back as
`Example`s. The shards are token ids only (a few MB in all), so a new machine recomputes the
features with one target forward per batch instead of regenerating.

`overlap(records, prompt_files, n)`: the corpus requests whose prompt or answer shares a word
n-gram (n = 8: lower-cased words) with any prompt of the evaluation sets. `load_corpus` drops
them, so no trained head has seen an evaluation prompt's 8-gram, and reports how many.
"""
from __future__ import annotations

import gzip
import json
import re
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from threading import Condition

from actors.sampling import SamplingParams
from actors.task_corpus import Example
from deploy.specialists.eagle_prompts import Job, compose_jobs

SHARD_JOBS = 256
MAX_NEW_TOKENS = 192
CORPUS_DIR = Path(__file__).resolve().parent / "data" / "eagle-smollm2-135m"  # the embedded target's shards
NGRAM = 8


@dataclass(frozen=True)
class CorpusRecord:
    job: str
    style: str
    stage: int  # 1: the job's first request; 2: the request built from its first answer
    prompt_ids: list[int]
    output_ids: list[int]

    def example(self) -> Example:
        return Example(tuple(self.prompt_ids), tuple(self.output_ids))


def second_request(job: Job, answer: str) -> list[dict] | None:
    """A chained job's second request from the target's first answer (None when there is none)."""
    if job.then is None or not answer.strip():
        return None
    if job.then_mode == "follow":
        return [*job.first, {"role": "assistant", "content": answer.strip()}, {"role": "user", "content": job.then}]
    return [{"role": "user", "content": job.then.replace("{answer}", answer.strip())}]


def generate_shard(scheduler, jobs: Sequence[Job], max_new_tokens: int = MAX_NEW_TOKENS,
                   progress: bool = False) -> list[CorpusRecord]:
    """Every job answered through `scheduler` (a BatchScheduler), chained requests as their first answers end."""
    from tqdm import tqdm

    target = scheduler.target
    greedy = SamplingParams(max_tokens=max_new_tokens)
    records: list[CorpusRecord] = []
    errors: list[BaseException] = []
    outstanding = [0]  # requests submitted and not yet handled (a chained job's second request counts from its submission)
    changed = Condition()
    bar = tqdm(total=len(jobs) + sum(job.then is not None for job in jobs), desc="corpus requests", disable=not progress)

    def submit(job: Job, stage: int, messages: list[dict]) -> None:
        prompt_ids = target.encode(messages=messages)
        with changed:
            outstanding[0] += 1
        scheduler.submit(prompt_ids, greedy).add_done_callback(lambda done: finished(job, stage, prompt_ids, done))

    def finished(job: Job, stage: int, prompt_ids: list[int], done: Future) -> None:
        try:
            result = done.result()
            records.append(CorpusRecord(job.id, job.style, stage, list(prompt_ids), list(result.token_ids)))
            bar.update(1 + (stage == 1 and job.then is not None and not result.text.strip()))
            if stage == 1 and (messages := second_request(job, result.text)) is not None:
                submit(job, 2, messages)
        except BaseException as err:  # noqa: BLE001 - raised in the caller's thread below
            errors.append(err)
        with changed:
            outstanding[0] -= 1
            changed.notify_all()

    for job in jobs:
        submit(job, 1, job.first)
    with changed:
        changed.wait_for(lambda: outstanding[0] == 0 or errors)
    bar.close()
    if errors:
        raise errors[0]
    return sorted(records, key=lambda r: (r.job, r.stage))


def shard_path(out_dir: Path, shard: int) -> Path:
    return out_dir / f"shard-{shard:03d}.jsonl.gz"


def write_shard(records: Iterable[CorpusRecord], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with gzip.open(partial, "wt") as out:
        for record in records:
            out.write(json.dumps(asdict(record), separators=(",", ":")) + "\n")
    partial.replace(path)


def shard_indices(out_dir: Path) -> list[int]:
    """The shards present in `out_dir`, in order."""
    return sorted(int(path.name.split("-")[1].split(".")[0]) for path in out_dir.glob("shard-*.jsonl.gz"))


def read_shard(path: Path) -> list[CorpusRecord]:
    with gzip.open(path, "rt") as lines:
        return [CorpusRecord(**json.loads(line)) for line in lines]


def build_shards(target, shards: Sequence[int], out_dir: Path = CORPUS_DIR, max_new_tokens: int = MAX_NEW_TOKENS,
                 drafters: str = "ngram,none", progress: bool = True, shard_jobs: int = SHARD_JOBS) -> list[dict]:
    """Generate the missing shards among `shards` (each a file; present ones are skipped), shard i holding
    jobs [i * shard_jobs, (i + 1) * shard_jobs) of `compose_jobs` (a test builds tiny shards).
    -> per shard generated: its index, requests, positions, generated tokens and seconds."""
    from actors.pool import build_drafters
    from deploy.engine.engine import SpeculativeEngine
    from deploy.engine.scheduler import BatchScheduler

    missing = [s for s in shards if not shard_path(out_dir, s).is_file()]
    if not missing:
        return []
    names = drafters.split(",")
    engine = SpeculativeEngine(target, build_drafters(names, target_vocab_size=target.vocab_size, target=target.name),
                               policy=f"fixed:{names[0]}", verify="chosen")
    scheduler = BatchScheduler(engine)
    every = compose_jobs((max(missing) + 1) * shard_jobs)
    done = []
    for shard in missing:
        start = time.perf_counter()
        records = generate_shard(scheduler, every[shard * shard_jobs : (shard + 1) * shard_jobs], max_new_tokens, progress)
        write_shard(records, shard_path(out_dir, shard))
        seconds = time.perf_counter() - start
        generated = sum(len(r.output_ids) for r in records)
        done.append({"shard": shard, "requests": len(records), "generated": generated,
                     "positions": sum(len(r.prompt_ids) + len(r.output_ids) for r in records),
                     "seconds": round(seconds, 1), "tokens_per_s": round(generated / seconds, 1)})
        if progress:
            print(json.dumps(done[-1]), flush=True)
    return done


_WORD = re.compile(r"\w+", re.UNICODE)


def word_ngrams(text: str, n: int = NGRAM) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i : i + n]) for i in range(len(words) - n + 1)}


def prompt_ngrams(prompt_files: Sequence[Path], n: int = NGRAM) -> set[tuple[str, ...]]:
    """Every word n-gram of every message (or raw prompt) of the bench prompt files."""
    from deploy.bench.prompts import load_prompts

    grams: set[tuple[str, ...]] = set()
    for path in prompt_files:
        for prompt in load_prompts(path):
            for text in [m["content"] for m in prompt.messages or [] if isinstance(m.get("content"), str)] + [prompt.prompt or ""]:
                grams |= word_ngrams(text, n)
    return grams


def overlap(records: Sequence[CorpusRecord], decode, evaluation: set[tuple[str, ...]], n: int = NGRAM) -> list[CorpusRecord]:
    """The records whose prompt or answer text (decode: token ids -> text) shares an n-gram with `evaluation`."""
    return [r for r in records if word_ngrams(decode(r.prompt_ids) + "\n" + decode(r.output_ids), n) & evaluation]


def evaluation_prompt_files() -> list[Path]:
    from deploy.bench.prompts import PROMPTS_DIR

    return sorted(PROMPTS_DIR.glob("*.jsonl"))


def load_corpus(target, out_dir: Path = CORPUS_DIR, shards: Sequence[int] | None = None) -> tuple[list[Example], dict]:
    """The shards' examples, less those sharing an 8-gram with an evaluation prompt.
    -> (examples, {shards, requests, dropped, positions, by_style})."""
    paths = sorted(out_dir.glob("shard-*.jsonl.gz")) if shards is None else [shard_path(out_dir, s) for s in shards]
    records = [r for path in paths for r in read_shard(path)]
    shared = {id(r) for r in overlap(records, target.decode, prompt_ngrams(evaluation_prompt_files()))}
    kept = [r for r in records if id(r) not in shared and r.output_ids]
    by_style: dict[str, int] = {}
    for r in kept:
        by_style[r.style] = by_style.get(r.style, 0) + 1
    return [r.example() for r in kept], {
        "shards": len(paths), "requests": len(records), "dropped_overlap": len(shared),
        "positions": sum(len(r.prompt_ids) + len(r.output_ids) for r in kept), "by_style": by_style}
