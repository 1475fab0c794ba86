"""The specialists the repository ships for the embedded target: every task's corpus and distilled
drafter, 25 MB at most together, what a clean machine's specialist pool is made of, and lossless
when they draft; a distilled drafter saved as its difference from the target loads to the
predictions it was trained to; a user's own specialist from a file, and its errors naming the field."""
from __future__ import annotations

import json

import pytest
import torch

from actors.sampling import SamplingParams
from actors.specialists import CORPUS_FILE, DISTILL_DIR, shipped_specialists

SHIPPED_TASKS = ("code", "math", "translation", "chat", "qa")
SHIPPED_BUDGET_BYTES = 25 * 2**20


def test_the_repository_ships_every_tasks_corpus_and_distilled_drafter_within_25_mb():
    root = shipped_specialists("smollm2-135m")
    for task in SHIPPED_TASKS:
        assert (root / task / CORPUS_FILE).is_file()
        meta = json.loads((root / task / DISTILL_DIR / "distill.json").read_text())
        assert meta["target"] == "smollm2-135m" and meta["num_layers"] == 2
    assert sum(f.stat().st_size for f in root.rglob("*") if f.is_file()) <= SHIPPED_BUDGET_BYTES


def test_a_clean_machines_specialist_pool_is_the_shipped_one(tmp_path, monkeypatch):
    from actors.pool import default_drafters, pool_drafters

    monkeypatch.setenv("SPECFLEET_CACHE", str(tmp_path))  # nothing built here
    ordered = sorted(SHIPPED_TASKS)
    assert pool_drafters("specialists") == (default_drafters() + tuple(f"retrieval-{t}" for t in ordered)
                                            + tuple(f"distill-{t}" for t in ordered))


def test_a_distilled_drafter_saved_as_its_difference_from_the_target_predicts_as_trained(tmp_path):
    from actors.models import load_draft_model
    from actors.models import load_causal_lm
    from actors.task_corpus import Example
    from deploy.specialists.distill import distill

    base = load_causal_lm("smollm2-135m", device="cpu", num_layers=1).model
    examples = [Example((1, 2, 3), tuple(range(100 + i, 130 + i))) for i in range(12)]
    model, report, deltas = distill(base, examples, eos_ids=[2], pad_id=0, epochs=2, rank=4)
    assert report.rank == 4 and set(deltas) and all(a.shape[0] == 4 and b.shape[1] == 4 for a, b in deltas.values())
    assert any(float(b.abs().max()) > 0 for _, b in deltas.values())  # it learned something to save
    model.save(tmp_path / "d", {"target": "smollm2-135m"}, deltas)
    loaded = load_draft_model(str(tmp_path / "d"))
    ids = torch.tensor([[1, 2, 3, *range(100, 110)]])
    with torch.no_grad():
        trained, reloaded = model.head_logits(ids), loaded.head_logits(ids)
    assert torch.equal(trained.argmax(-1), reloaded.argmax(-1))
    assert float((trained - reloaded).abs().max()) < 0.05 * float(trained.abs().max())  # float16 on disk


def test_the_shipped_specialists_draft_and_the_output_equals_plain_decoding(target):
    from actors.pool import build_drafters
    from deploy.engine.engine import SpeculativeEngine
    from tests.conftest import plain_text

    drafters = build_drafters(["retrieval-code", "distill-code", "none"], target_vocab_size=target.vocab_size)
    engine = SpeculativeEngine(target, drafters, policy="metasd-ucb", k=4, cut_drafts=False)
    messages = [{"role": "user", "content": "Write a Python function that returns the squares of a list of numbers."}]
    result = engine.generate(messages=messages, sampling=SamplingParams(max_tokens=32))
    assert result.text == plain_text(target, messages, 32)
    drafted = result.summary["per_drafter"]
    assert drafted["distill-code"]["drafted"] > 0 and drafted["retrieval-code"]["drafted"] > 0


@pytest.mark.parametrize("lines, args, param", [
    (['{"text": "x"}'], ["--name", "Bad Name"], "name"),
    (['{"prompt": "hi", "text": "both"}'], ["--name", "mine"], "from"),
    (["not json"], ["--name", "mine"], "from"),
    (['{"messages": []}'], ["--name", "mine"], "from"),
    ([], ["--name", "mine"], "from"),
    (['{"text": "x"}'], [], "name"),  # --from without --name
])
def test_a_bad_own_specialist_file_or_name_is_an_error_naming_the_field(tmp_path, capsys, lines, args, param):
    from deploy.cli import main

    source = tmp_path / "mine.jsonl"
    source.write_text("\n".join(lines) + "\n")
    assert main(["specialists", "--from", str(source), *args]) == 2  # before any model loads
    assert capsys.readouterr().err.startswith(f"error: {param}:")
