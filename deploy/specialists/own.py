"""A user's own specialist: a retrieval drafter (and, asked, a distilled one) from a file of their prompts or texts.

`read_source(FILE)` reads the JSON lines of a user's file (what `specfleet specialists --from FILE
--name NAME` passes on to `build_own_specialist(target, requests, texts, name, root, distilled)`),
each one of
- `{"messages": [...]}` or `{"prompt": "..."}`: a request; the target's greedy answer to it joins
  the corpus with the prompt, as the built-in tasks' corpora are made;
- `{"text": "..."}`: a text taken as it is (documents, past answers, code).
It writes `<root>/<name>/corpus.npz` (so `retrieval-<name>` exists) and, with `distilled`, the
distilled drafter `<root>/<name>/distill/` (`distill-<name>`; minutes: it trains). `specfleet
drafters add retrieval-<name> --kind retrieval-<name>` then puts it into a running pool.
Bad input raises InvalidRequestError naming `from` (with the line) or `name`.
"""
from __future__ import annotations

import time
from pathlib import Path

from actors.errors import InvalidRequestError
from actors.specialists import CORPUS_FILE, DISTILL_DIR, SPECIALIST_NAME
from actors.task_corpus import Example, save_corpus
from deploy.bench.prompts import json_lines
from deploy.engine.target import TargetModel
from deploy.specialists.corpus import target_outputs


def read_source(path: Path) -> tuple[list[list[dict]], list[str]]:
    """-> (requests as chat messages, texts) from the JSON lines at path."""
    if not path.is_file():
        raise InvalidRequestError("from", f"{path} is not a file")
    requests: list[list[dict]] = []
    texts: list[str] = []
    for line_no, row in json_lines(path, "from"):
        fields = [f for f in ("messages", "prompt", "text") if isinstance(row, dict) and f in row]
        if len(fields) != 1:
            raise InvalidRequestError("from", f"line {line_no}: needs exactly one of messages, prompt or text")
        value = row[fields[0]]
        if fields[0] == "messages":
            if not isinstance(value, list) or not value or not all(isinstance(m, dict) and isinstance(m.get("content"), str) for m in value):
                raise InvalidRequestError("from", f"line {line_no}: messages must be a non-empty list of {{role, content}}")
            requests.append(value)
        elif not isinstance(value, str) or not value.strip():
            raise InvalidRequestError("from", f"line {line_no}: {fields[0]} must be a non-empty string")
        elif fields[0] == "prompt":
            requests.append([{"role": "user", "content": value}])
        else:
            texts.append(value)
    if not requests and not texts:
        raise InvalidRequestError("from", f"{path} holds no prompts or texts")
    return requests, texts


def check_name(name: str) -> None:
    if SPECIALIST_NAME.match(f"retrieval-{name}") is None:
        raise InvalidRequestError("name", f"must be lower-case letters, digits and _, got {name!r}")


def build_own_specialist(target: TargetModel, requests: list[list[dict]], texts: list[str], name: str, root: Path,
                         distilled: bool = False, max_new_tokens: int = 128, epochs: int = 8, progress: bool = False) -> dict:
    """From read_source's requests and texts, a specialist named `name` (check_name) -> what was
    built: the names to add, corpus counts, seconds."""
    from deploy.specialists.build import build_distilled

    start = time.perf_counter()
    examples = target_outputs(target, requests, max_new_tokens=max_new_tokens, progress=progress) if requests else []
    examples += [Example((), tuple(target.tokenizer(text, add_special_tokens=False)["input_ids"])) for text in texts]
    save_corpus(examples, root / name / CORPUS_FILE)
    built = {"name": name, "drafters": [f"retrieval-{name}"], "requests": len(requests), "texts": len(texts),
             "corpus_tokens": sum(len(e.token_ids) for e in examples), "corpus_s": round(time.perf_counter() - start, 1)}
    if distilled:
        if not any(e.output_ids for e in examples):
            raise InvalidRequestError("from", "a distilled drafter needs answers or texts to learn from")
        built["distill"] = build_distilled(target, examples, root / name / DISTILL_DIR, num_layers=2, epochs=epochs,
                                           log=print if progress else None)
        built["drafters"].append(f"distill-{name}")
    return built
