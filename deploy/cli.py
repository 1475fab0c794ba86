"""The `specfleet` command line: `generate` and `bench` (in-process engine), `serve` (Ray Serve),
`drafters list|add|remove` (the running service's admin API), `status` (where everything runs),
`distill` / `specialists` (build task-specialist drafters; deploy/specialists/) and `train-eagle`
(the eagle drafter's head for a target; deploy/specialists/eagle.py).

Errors in user input print one line, `error: <flag or field>: <message>`, and exit with status 2
(a bad flag, a bad config value named by the flag that sets it); a failure that is not the user's
prints one line naming its type and exits 1 (SPECFLEET_DEBUG=1 shows the traceback). The admin
commands find the service at SPECFLEET_URL (default http://127.0.0.1:8000).
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path

from actors.errors import InvalidRequestError


def _model_args(parser: argparse.ArgumentParser) -> None:
    from actors.models import DEFAULT_MODEL
    from actors.pool import DEFAULT_DRAFTERS, GPU_DEFAULT_DRAFTERS, POOLS

    parser.add_argument("--model", default=DEFAULT_MODEL, help="target: embedded name, local dir, .gguf file or hub id")
    parser.add_argument("--dtype", default="float32", help="float32 (default; bit-exact greedy), bfloat16, float16")
    _pool_arg(parser)
    parser.add_argument("--drafters", default=None,
                        help=f"comma list of ngram,suffix,hierarchy,hf,eagle,recycling,none,retrieval-<task>,distill-<task> "
                             f"(default: the --pool's; {POOLS[0]}: {','.join(DEFAULT_DRAFTERS)} on CPU, "
                             f"{','.join(GPU_DEFAULT_DRAFTERS)} on a GPU)")
    parser.add_argument("--draft-model", default=None, help="model for the hf drafter (same tokenizer as the target)")
    parser.add_argument("--draft-layers", type=int, default=None, help="keep only the first N layers of the draft model")
    from deploy.engine.defaults import K

    parser.add_argument("--k", type=int, default=K, help="max tokens drafted per round")


def _pool_arg(parser: argparse.ArgumentParser) -> None:
    from actors.pool import POOLS

    parser.add_argument("--pool", default=POOLS[0], choices=POOLS,
                        help="specialists: the generic drafters plus every task specialist (shipped for the embedded default, or built by `specfleet specialists`)")


def _drafter_names(args: argparse.Namespace) -> str:
    from actors.pool import pool_drafters

    return args.drafters if args.drafters else ",".join(pool_drafters(args.pool, args.model))


def _load(args: argparse.Namespace):
    from actors.models import load_causal_lm, load_draft_model
    from deploy.engine.target import TargetModel

    target = TargetModel(load_causal_lm(args.model, dtype=args.dtype))
    draft_model = None
    if args.draft_model:
        draft_model = load_draft_model(args.draft_model, dtype=args.dtype, num_layers=args.draft_layers)
    return target, draft_model


def cmd_generate(args: argparse.Namespace) -> int:
    from actors.no_draft import NO_DRAFT
    from actors.pool import build_drafters, parse_drafter_names
    from actors.sampling import SamplingParams
    from deploy.engine.engine import SpeculativeEngine
    from policy.registry import CHOSEN, parse_policy

    sampling = SamplingParams(
        max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k,
        seed=args.seed, stop=tuple(args.stop or ()),
    )
    messages = None
    if args.messages is not None:
        try:
            messages = json.loads(args.messages)
        except json.JSONDecodeError as err:
            raise InvalidRequestError("messages", f"not valid JSON: {err}") from err
    drafters, policy = (NO_DRAFT, f"fixed:{NO_DRAFT}") if args.no_spec else (_drafter_names(args), args.policy)
    verify = CHOSEN if args.no_spec else args.verify
    parse_policy(policy, parse_drafter_names(drafters), verify)  # a bad name fails before the model loads
    target, draft_model = _load(args)
    engine = SpeculativeEngine(target, build_drafters(drafters, draft_model, target.vocab_size, target.name), policy=policy, k=args.k,
                               verify=verify)
    result = engine.generate(prompt=args.prompt, messages=messages, sampling=sampling)
    if args.json:
        print(json.dumps(result.to_dict(trace=args.trace)))
    else:
        print(result.text)
        s = result.summary
        rate = "n/a" if s["draft_acceptance_rate"] is None else f"{s['draft_acceptance_rate']:.2f}"
        print(f"\n[{len(result.token_ids)} tokens, {s['rounds']} rounds, mean acceptance length "
              f"{s['mean_acceptance_length'] or 0:.2f}, draft acceptance {rate}, finish {result.finish_reason}]",
              file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from actors.pool import parse_drafter_names
    from deploy.bench import expand_runs, load_prompts, render_table, run_bench
    from deploy.bench.load_report import render_load
    from deploy.bench.prompts import first_per_task, in_turns

    prompts = load_prompts(args.prompts)
    if args.tasks:
        wanted = set(args.tasks.split(","))
        prompts = [p for p in prompts if p.task in wanted]
    if args.split:
        prompts = [p for p in prompts if p.split == args.split]
        if not prompts:
            raise InvalidRequestError("split", f"{args.prompts} holds no {args.split} prompts (of the tasks asked for)")
    if args.per_task is not None:
        if args.per_task < 1:
            raise InvalidRequestError("per_task", f"must be at least 1, got {args.per_task}")
        prompts = first_per_task(prompts, args.per_task)
    if args.interleave:
        prompts = in_turns(prompts)
    if args.limit:
        prompts = prompts[: args.limit]
    from deploy.bench.runs import MAX_REPEAT

    if not 1 <= args.repeat <= MAX_REPEAT:
        raise InvalidRequestError("repeat", f"must be in 1..{MAX_REPEAT}, got {args.repeat}")
    if args.tree_budget is not None and args.tree_budget < 1:
        raise InvalidRequestError("tree_budget", f"must be at least 1, got {args.tree_budget}")
    drafters = parse_drafter_names(_drafter_names(args))
    expand_runs(args.runs, drafters, args.draft_model is not None)  # a bad run or drafter name fails before the model loads
    target, draft_model = _load(args)
    report = run_bench(target, prompts, runs=args.runs, max_tokens=args.max_tokens, k=args.k,
                       drafters=drafters, draft_model=draft_model, progress=not args.no_progress,
                       concurrency=args.concurrency, trace_prompt=args.trace_prompt, cost_profile=args.cost_profile,
                       cut_drafts=not args.no_cut, tree_budget=args.tree_budget, repeat=args.repeat,
                       alternate=args.alternate)
    report["params"]["interleaved"] = args.interleave
    table = "\n".join([render_table(report), *render_load(report)])
    if args.out:
        from deploy.bench.charts import concurrency_chart, drafter_chart, reliability_chart, speedup_chart

        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1))
        charts = [speedup_chart(report, out.with_suffix(".speedup.png")),
                  drafter_chart(report, out.with_suffix(".drafters.png")),
                  concurrency_chart(report, out.with_suffix(".concurrency.png")),
                  reliability_chart(report, out.with_suffix(".calibration.png"))]
        images = "".join(f"\n![{c.stem}]({c.name})\n" for c in charts if c is not None)
        out.with_suffix(".md").write_text(table + "\n" + images)
    print(table)
    return 0


def _require_free_port(flag: str, host: str, port: int) -> None:
    """Serve's proxy reports a taken port only in its logs; refuse to start instead."""
    import socket

    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as err:
            raise InvalidRequestError(flag, f"{host}:{port} is in use ({err.strerror}): stop what listens there "
                                            f"(another specfleet serve?) or choose another {flag}") from None


def cmd_serve(args: argparse.Namespace) -> int:
    from deploy.serve_flags import apply_flags
    from deploy.service.app import load_serve_config, serve_config_yaml, serve_forever

    try:
        config_args, _ = load_serve_config(args.config)
    except (OSError, ValueError) as err:
        raise InvalidRequestError("--config", str(err)) from None
    if args.print_config:
        print(serve_config_yaml(args.config, apply_flags(config_args, args), args.host, args.port), end="")
        return 0
    _require_free_port("--port", args.host, args.port)
    _require_free_port("--grpc-port", "127.0.0.1", args.grpc_port)
    serve_forever(apply_flags(config_args, args), host=args.host, port=args.port, grpc_port=args.grpc_port,
                  pool=args.pool)
    return 0


def cmd_distill(args: argparse.Namespace) -> int:
    from actors.models import load_causal_lm
    from deploy.engine.target import TargetModel
    from actors.specialists import CORPUS_FILE
    from deploy.specialists.build import build_distilled, corpus_for

    target = TargetModel(load_causal_lm(args.model, device="cpu"))
    out = Path(args.out)
    examples = corpus_for(target, Path(args.prompts), out / CORPUS_FILE, args.max_new_tokens, progress=True)
    meta = build_distilled(target, examples, out, args.layers, args.epochs, log=print) | {"task": args.task}
    print(json.dumps(meta, indent=1))
    return 0


def cmd_specialists(args: argparse.Namespace) -> int:
    from actors.models import load_causal_lm
    from actors.specialists import OTHER_VOCAB, specialists_root
    from deploy.engine.target import TargetModel
    from deploy.specialists.build import build_specialists
    from deploy.specialists.own import build_own_specialist, check_name, read_source
    from deploy.specialists.tasks import SPECIALIST_TASKS, training_prompts

    root = Path(args.out).expanduser() if args.out else specialists_root()
    if args.source or args.name:  # a user's own specialist
        if not (args.source and args.name):
            raise InvalidRequestError("from" if args.name else "name", "--from FILE and --name NAME go together")
        check_name(args.name)
        requests, texts = read_source(Path(args.source).expanduser())  # bad input: an error before the target loads
        target = TargetModel(load_causal_lm(args.model, device="cpu"))
        built = build_own_specialist(target, requests, texts, args.name, root, distilled=args.distilled,
                                     epochs=args.epochs, progress=True)
        print(json.dumps(built, indent=1))
        print(f"built under {root / args.name}; add to a running service with: "
              + "; ".join(f"specfleet drafters add {n} --kind {n}" for n in built["drafters"]), file=sys.stderr)
        return 0
    tasks = args.tasks.split(",") if args.tasks else [*SPECIALIST_TASKS, OTHER_VOCAB]
    for task in tasks:
        if task != OTHER_VOCAB:
            training_prompts(task, 1)  # an unknown task is an error naming `task` before anything loads
    target = TargetModel(load_causal_lm(args.model, device="cpu"))
    manifest = build_specialists(target, [t for t in tasks if t != OTHER_VOCAB], num_layers=args.layers, epochs=args.epochs,
                                 root=root, rebuild=args.rebuild, other_vocab=OTHER_VOCAB in tasks)
    print(json.dumps(manifest, indent=1))
    print(f"specialists under {root}: built in {manifest['build_s']:.0f} s in all on this machine "
          f"({manifest['this_run_s']:.0f} s this run)", file=sys.stderr)
    return 0


def cmd_othervocab(args: argparse.Namespace) -> int:
    from actors.models import load_causal_lm
    from actors.specialists import OTHER_VOCAB, specialists_root
    from deploy.engine.target import TargetModel
    from deploy.specialists.build import build_distilled
    from deploy.specialists.eagle_corpus import load_corpus
    from deploy.specialists.other_vocab import build_other_vocab

    target = TargetModel(load_causal_lm(args.model, device="cpu"))
    examples, _ = load_corpus(target)
    examples = examples[: args.limit]
    out = Path(args.out).expanduser() if args.out else specialists_root() / OTHER_VOCAB
    if args.same_vocabulary:  # the twin: the distilled-specialist recipe on the same answers, one epoch
        meta = build_distilled(target, examples, out, num_layers=2, epochs=1, log=print)
    else:
        meta = build_other_vocab(target, examples, out, vocabulary=args.vocabulary, max_minutes=args.max_minutes, log=print)
    print(json.dumps(meta, indent=1))
    print(f"built under {out}", file=sys.stderr)
    return 0


def cmd_train_eagle(args: argparse.Namespace) -> int:
    from actors.eagle_head import eagle_dir
    from actors.models import load_causal_lm
    from deploy.bench.prompts import load_prompts
    from deploy.engine.target import TargetModel
    from deploy.specialists.eagle import EPOCHS, VOCABULARY, build_eagle

    args.epochs = EPOCHS if args.epochs is None else args.epochs
    args.vocabulary = VOCABULARY if args.vocabulary is None else args.vocabulary
    if args.epochs < 1:
        raise InvalidRequestError("epochs", f"must be at least 1, got {args.epochs}")
    if args.vocabulary < 2:
        raise InvalidRequestError("vocabulary", f"must be at least 2, got {args.vocabulary}")
    if args.max_minutes is not None and args.max_minutes <= 0:
        raise InvalidRequestError("max_minutes", f"must be positive, got {args.max_minutes}")
    shards = _shard_list(args.shards) if args.shards else None
    for prompt_file in args.prompts or ():
        load_prompts(prompt_file)  # a bad file is an error naming `prompts` before anything loads
    target = TargetModel(load_causal_lm(args.model, dtype=args.dtype, device=args.device))
    out = Path(args.out) if args.out else eagle_dir(args.model)
    started = time.perf_counter()
    try:
        manifest = build_eagle(target, out, shards, [Path(p) for p in args.prompts or ()],
                               Path(args.corpus) if args.corpus else None, epochs=args.epochs, vocabulary=args.vocabulary,
                               steps=args.steps, max_minutes=args.max_minutes)
    except ValueError as err:
        raise InvalidRequestError("corpus", str(err)) from err
    if manifest is None:
        print(f"stopped after {args.max_minutes} minutes (features and checkpoint kept under $SPECFLEET_CACHE/eagle-work): "
              "run the same command again to resume",
              file=sys.stderr)
        return 3
    print(json.dumps(manifest, indent=1))
    print(f"eagle head for {args.model} at {out}: this run {time.perf_counter() - started:.0f} s "
          f"(target features {manifest['features_s']:.0f} s, training {manifest['train_s']:.0f} s in all; "
          f"held-out agreement by depth {manifest['heldout_agreement_by_depth']})", file=sys.stderr)
    return 0


def _shard_list(text: str) -> list[int]:
    """'0-9' or '0,3,5' -> shard indices."""
    try:
        shards = sorted({i for part in text.split(",") for i in (
            range(int(part.split("-")[0]), int(part.split("-")[1]) + 1) if "-" in part else [int(part)])})
    except ValueError as err:
        raise InvalidRequestError("shards", f"a list such as 0-9 or 0,3,5, got {text!r}") from err
    if not shards or shards[0] < 0:
        raise InvalidRequestError("shards", f"needs shard indices of 0 or more, got {text!r}")
    return shards


def cmd_recycling_prior(args: argparse.Namespace) -> int:
    from actors.models import load_causal_lm
    from actors.recycling_table import prior_dir
    from deploy.engine.target import TargetModel
    from deploy.specialists.eagle_corpus import CORPUS_DIR, load_corpus
    from deploy.specialists.recycling_prior import write_prior

    if args.limit is not None and args.limit < 1:
        raise InvalidRequestError("limit", f"must be at least 1, got {args.limit}")
    shards = _shard_list(args.shards) if args.shards else None
    target = TargetModel(load_causal_lm(args.model, dtype=args.dtype, device=args.device))
    corpus_dir = Path(args.corpus) if args.corpus else CORPUS_DIR
    examples, corpus = load_corpus(target, corpus_dir, shards)
    if not examples:
        raise InvalidRequestError("corpus", f"no corpus shards (shard-*.jsonl.gz) in {corpus_dir}")
    examples = examples[: args.limit]
    out = Path(args.out) if args.out else prior_dir(args.model)
    manifest = write_prior(target, args.model, examples, corpus | {"dir": corpus_dir.name}, out, progress=not args.no_progress)
    print(json.dumps(manifest, indent=1))
    print(f"recycling prior for {args.model} at {out}: {manifest['rows']} rows from {manifest['corpus']['positions_read']} "
          f"positions in {manifest['build_s']:.0f} s", file=sys.stderr)
    return 0


def cmd_eagle_corpus(args: argparse.Namespace) -> int:
    from actors.models import load_causal_lm
    from deploy.engine.target import TargetModel
    from deploy.specialists.eagle_corpus import CORPUS_DIR, MAX_NEW_TOKENS, build_shards

    shards = _shard_list(args.shards)
    target = TargetModel(load_causal_lm(args.model, dtype=args.dtype))
    done = build_shards(target, shards, Path(args.out) if args.out else CORPUS_DIR, args.max_new_tokens or MAX_NEW_TOKENS)
    print(json.dumps(done, indent=1))
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from cluster.local import connect
    from cluster.pool import pool_status
    from cluster.status import render_status

    connect(args.address)
    try:
        status = pool_status()
    except ValueError as err:  # no coordinator actor: nothing deployed on this cluster
        print(f"error: no specfleet service on the cluster at {args.address}: {err}", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=1) if args.json else render_status(status))
    return 0


def cmd_drafters(args: argparse.Namespace) -> int:
    from deploy.service.admin_client import AdminClient, AdminError
    from deploy.service.auth import admin_tokens

    tokens = admin_tokens()
    client = AdminClient(args.url, tokens[0] if tokens else None)
    try:
        if args.action == "list":
            drafters = client.list()
            if args.json:
                print(json.dumps(drafters, indent=1))
            else:
                from cluster.status import render_drafters

                print(render_drafters(drafters))
        elif args.action == "add":
            spec = {"name": args.name, "kind": args.kind, "model": args.model, "num_layers": args.num_layers,
                    "num_gpus": args.num_gpus, "resources": json.loads(args.resources) if args.resources else {}}
            placed = client.add({k: v for k, v in spec.items() if v not in (None, {})})
            print(f"added {placed['name']} on node {placed['node'][:8]} ({placed['node_ip']}), "
                  f"GPU {','.join(placed['gpu']) or '-'}, device {placed['device']}")
        else:
            client.remove(args.name)
            print(f"removed {args.name}")
    except AdminError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except OSError as err:
        print(f"error: cannot reach the service at {args.url}: {err}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    from actors.specialists import OTHER_VOCAB_EXAMPLES
    from deploy.bench import DEFAULT_PROMPTS, DEFAULT_RUNS
    from deploy.bench.prompts import SPLITS
    from deploy.serve_flags import add_serve_flags
    from policy.registry import DEFAULT_POLICY, DEFAULT_VERIFY, VERIFY_MODES

    parser = OneLineErrorParser(prog="specfleet", description="Multi-drafter speculative decoding (MetaSD).")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="generate one completion in-process")
    source = gen.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="raw completion prompt")
    source.add_argument("--messages", help='chat messages as JSON: [{"role": "user", "content": "..."}]')
    _model_args(gen)
    gen.add_argument("--policy", default=DEFAULT_POLICY, help=f"the bandit and its reward: {DEFAULT_POLICY} (default), metasd-ucb-cost, metasd-ucb, fixed:ngram, ...")
    gen.add_argument("--verify", default=DEFAULT_VERIFY, choices=VERIFY_MODES,
                     help="how a round's drafts are verified: the chosen draft (chosen), it with model-free shadows "
                          "scored against the output (counterfactual), or the node-cut tree of every draft (tree, default)")
    gen.add_argument("--max-tokens", type=int, default=128, help="the most tokens to generate")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy; > 0 samples")
    gen.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling: keep the smallest set of tokens with this much mass")
    gen.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0: off)")
    gen.add_argument("--seed", type=int, default=None, help="the sampling seed (same seed, same output)")
    gen.add_argument("--stop", action="append", help="stop string (repeatable)")
    gen.add_argument("--no-spec", action="store_true", help="plain target decoding")
    gen.add_argument("--json", action="store_true", help='print {"text", "token_ids", "finish_reason", "stats"}')
    gen.add_argument("--trace", action="store_true", help="with --json: include the per-round trace")
    gen.set_defaults(func=cmd_generate)

    bench = sub.add_parser("bench", help="benchmark runs side by side (JSON + Markdown report)")
    _model_args(bench)
    bench.add_argument("--prompts", default=str(DEFAULT_PROMPTS), help="JSONL: {id, task, messages|prompt}")
    bench.add_argument("--max-tokens", type=int, default=128, help="tokens generated per prompt")
    bench.add_argument("--runs", default=DEFAULT_RUNS, help="comma list: ar, peer:<name>, single:<drafter>, policy:<policy>[@<verify>], serve:<policy>[@<verify>]; "
                            "globs allowed (peer:*, single:*); e.g. policy:metasd-ucb-cost-warm@tree; "
                            "a policy or serve run ending -without-<drafter>[+<drafter>] uses the pool less those")
    bench.add_argument("--out", default=None, help="write the JSON report here (a .md table and .png charts beside it)")
    bench.add_argument("--tasks", default=None, help="only these tasks (comma list)")
    bench.add_argument("--limit", type=int, default=None, help="only the first N prompts")
    bench.add_argument("--split", choices=SPLITS, default=None,
                       help="only the prompts of this split: dev (tuned on) or test (reported only; default: all)")
    bench.add_argument("--cost-profile", default=None,
                       help="run in-process engines as on a device with this verification cost profile (its costs "
                            "decide cuts, budgets and rewards) and also report their speed re-timed with it "
                            "(python -m deploy.bench.verify_cost --out FILE; shipped: docs/results/h200.verify_cost.json)")
    bench.add_argument("--concurrency", default="1",
                       help="serve:<policy> runs: comma list of client concurrency levels, e.g. 1,4,8")
    bench.add_argument("--trace-prompt", default=None,
                       help="prompt id whose per-round drafter choices are kept (default: the first prompt)")
    bench.add_argument("--per-task", type=int, default=None, help="only the first N prompts of each task")
    bench.add_argument("--interleave", action="store_true",
                       help="the prompts a task at a time in turn, as mixed traffic arrives (default: the file's order)")
    bench.add_argument("--tree-budget", type=int, default=None,
                       help="the most draft nodes a round verifies (in-process engines; also the recycling drafter's tree size)")
    bench.add_argument("--repeat", type=int, default=1,
                       help="run each level's swept runs (batch:, serve:, batching peers) N times; rows report the median and spread")
    bench.add_argument("--alternate", action="store_true",
                       help="with --repeat: every other repetition runs the level's runs in reverse order")
    bench.add_argument("--no-cut", action="store_true",
                       help="verify every drafted token, not the length worth verifying: each drafter's acceptance at the full --k")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.set_defaults(func=cmd_bench)

    srv = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API and gRPC on a local Ray cluster (127.0.0.1)",
                         description="Serve MODEL (default: the config's) with speculative decoding. Every field of "
                                     "the config's `args` has a flag; a flag given overrides the config.")
    srv.add_argument("--config", default=str(Path(__file__).parent / "serve_config.yaml"),
                     help="a Ray Serve config whose application `specfleet` holds the args (the full form; flags override it)")
    add_serve_flags(srv)
    srv.add_argument("--host", default="127.0.0.1", help="the HTTP address to listen on (default 127.0.0.1: this machine only)")
    srv.add_argument("--port", type=int, default=8000, help="the HTTP port (default 8000)")
    srv.add_argument("--grpc-port", type=int, default=9000,
                     help="gRPC port (Serve's gRPC proxy, bound to 127.0.0.1; deploy/service/proto/specfleet.proto)")
    _pool_arg(srv)
    srv.add_argument("--print-config", action="store_true",
                     help="print the Serve config these flags make (for `serve deploy` on a cluster) and exit")
    srv.set_defaults(func=cmd_serve)

    dist = sub.add_parser("distill", help="distil a task drafter from the target's answers to a prompt file")
    dist.add_argument("--task", required=True, help="the task's name (recorded with the drafter)")
    dist.add_argument("--prompts", required=True, help="JSONL training prompts {id, task, messages|prompt}")
    dist.add_argument("--out", required=True, help="directory for the drafter (and the corpus it was trained on)")
    dist.add_argument("--model", default="smollm2-135m", help="the target to distil from")
    dist.add_argument("--layers", type=int, default=2, help="decoder layers kept from the target")
    dist.add_argument("--epochs", type=int, default=8, help="training epochs over the corpus")
    dist.add_argument("--max-new-tokens", type=int, default=128, help="length of the target's answers")
    dist.set_defaults(func=cmd_distill)

    spec = sub.add_parser("specialists", help="build the specialist pool (corpus, retrieval datastore, distilled drafter per task)")
    spec.add_argument("--tasks", default=None, help="comma list (default: code,math,translation,chat,qa,othervocab)")
    spec.add_argument("--model", default="smollm2-135m", help="the target")
    spec.add_argument("--layers", type=int, default=2, help="decoder layers of each distilled drafter")
    spec.add_argument("--epochs", type=int, default=8, help="training epochs of each distilled drafter")
    spec.add_argument("--rebuild", action="store_true", help="build again the tasks already built")
    spec.add_argument("--out", default=None, help="directory to build into (default: this machine's specialists, "
                                                  "found before the shipped ones; actors/data/specialists/<target> to rebuild those)")
    spec.add_argument("--from", dest="source", default=None, help="your own specialist from this JSONL file: lines "
                      "{messages|prompt} (the target answers them) or {text} (taken as it is); needs --name")
    spec.add_argument("--name", default=None, help="your specialist's name (a-z, 0-9, _): drafters retrieval-NAME (and distill-NAME)")
    spec.add_argument("--distilled", action="store_true", help="with --from: also distil a drafter model (minutes)")
    spec.set_defaults(func=cmd_specialists)

    other = sub.add_parser("othervocab", help="build the drafter of another vocabulary (its own BPE tokenizer, a 2-layer LM "
                                              "trained on the target's answers; `make specialists` builds it too)")
    other.add_argument("--model", default="smollm2-135m", help="the target")
    other.add_argument("--out", default=None, help="directory (default: the specialists' othervocab/)")
    other.add_argument("--vocabulary", type=int, default=8192, help="tokens of the new tokenizer")
    other.add_argument("--max-minutes", type=float, default=15.0, help="training stops after this long")
    other.add_argument("--limit", type=int, default=OTHER_VOCAB_EXAMPLES, help="train on the corpus's first N answers "
                       "(default: as `make specialists` builds it)")
    other.add_argument("--same-vocabulary", action="store_true",
                       help="build its same-vocabulary twin instead (the distilled-specialist recipe, 2 layers, one epoch "
                            "on the same answers; load it with --draft-model DIR)")
    other.set_defaults(func=cmd_othervocab)

    eagle = sub.add_parser("train-eagle", help="train the eagle drafter's EAGLE-3 head on the target's own features and answers")
    eagle.add_argument("--model", default="smollm2-135m", help="the target (any Llama-shaped transformers model)")
    eagle.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16")
    eagle.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: CUDA when available)")
    eagle.add_argument("--corpus", default=None, help="the corpus shards' directory (default: the embedded target's, in the repository)")
    eagle.add_argument("--shards", default=None, help="which corpus shards, e.g. 0-9 (default: every shard there)")
    eagle.add_argument("--prompts", action="append", default=None,
                       help="a JSONL prompt file (as the bench's) whose answers join the corpus, e.g. your own traffic; repeatable")
    eagle.add_argument("--epochs", type=int, default=None, help="training epochs over the corpus (default: the recipe's)")
    eagle.add_argument("--vocabulary", type=int, default=None,
                       help="the head's vocabulary: the most frequent answer tokens (default: the recipe's)")
    eagle.add_argument("--steps", type=int, default=3, help="drafting steps unrolled in training (training-time test)")
    eagle.add_argument("--max-minutes", type=float, default=None,
                       help="stop after this long with a checkpoint (exit 3); the same command resumes it")
    eagle.add_argument("--out", default=None, help="directory for the head (default: where `--drafters eagle` looks first)")
    eagle.set_defaults(func=cmd_train_eagle)

    corpus = sub.add_parser("eagle-corpus", help="generate shards of the eagle head's corpus: the target's answers to broad requests")
    corpus.add_argument("--shards", default="0-9", help="which shards, e.g. 0-9 or 3,4 (present shard files are skipped)")
    corpus.add_argument("--model", default="smollm2-135m", help="the target")
    corpus.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16")
    corpus.add_argument("--max-new-tokens", type=int, default=None, help="the longest answer (default 192)")
    corpus.add_argument("--out", default=None, help="directory of the shards (default: the embedded target's, in the repository)")
    corpus.set_defaults(func=cmd_eagle_corpus)

    prior = sub.add_parser("recycling-prior", help="build the recycling drafter's prior: the target's own top-k predictions "
                                                   "over the eagle corpus, a table of a few MB with its manifest")
    prior.add_argument("--model", default="smollm2-135m", help="the target")
    prior.add_argument("--dtype", default="float32", help="float32 (default), bfloat16, float16")
    prior.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: CUDA when available)")
    prior.add_argument("--corpus", default=None,
                       help="corpus shards' directory (specfleet eagle-corpus --out; default: the embedded target's, in the repository)")
    prior.add_argument("--shards", default=None, help="which corpus shards, e.g. 0-9 (default: every shard there)")
    prior.add_argument("--limit", type=int, default=None, help="only the first N corpus examples")
    prior.add_argument("--out", default=None, help="directory for the prior (default: where `--drafters recycling` looks first)")
    prior.add_argument("--no-progress", action="store_true", help="no progress bar")
    prior.set_defaults(func=cmd_recycling_prior)

    drafters = sub.add_parser("drafters", help="the running service's drafter pool (admin API; needs the admin token)")
    actions = drafters.add_subparsers(dest="action", required=True)
    for action, text in (("list", "the drafters, where they run, their health and statistics"),
                         ("add", "add a drafter (its own actor, or hosted by the coordinator for a lookup) as an arm, live"),
                         ("remove", "drain a drafter out of the pool and stop it")):
        one = actions.add_parser(action, help=text)
        one.add_argument("--url", default=os.environ.get("SPECFLEET_URL", "http://127.0.0.1:8000"),
                         help="the service's HTTP address (default: SPECFLEET_URL, else http://127.0.0.1:8000)")
        if action == "list":
            one.add_argument("--json", action="store_true",
                             help='print [{"name", "kind", "model", "node", "gpu", "status", "pulls", "acceptance", ...}]')
        else:
            one.add_argument("name", help="the drafter's name in the pool")
        if action == "add":
            one.add_argument("--kind", required=True, help="ngram, suffix, hierarchy, hf, none, or a built specialist retrieval-<task> / distill-<task>")
            one.add_argument("--model", default=None, help="draft model (hf): embedded name, local dir or .gguf")
            one.add_argument("--num-layers", type=int, default=None, help="keep the model's first N layers")
            one.add_argument("--num-gpus", type=float, default=None, help="default: 1 on a GPU cluster for a model drafter; a lookup drafter asking none is hosted by the coordinator")
            one.add_argument("--resources", default=None, help='custom Ray resources as JSON, e.g. {"specfleet_drafter": 1}')
        one.set_defaults(func=cmd_drafters)

    status = sub.add_parser("status", help="where the target replicas and each drafter run (node, GPU), and the pool's health")
    status.add_argument("--address", default="auto", help="the Ray cluster (default: RAY_ADDRESS or the local one)")
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(func=cmd_status)
    return parser


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (`specfleet serve: error: argument --port: ...`), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (--help lists the flags)\n")


def config_error(err) -> str:
    """A pydantic error of the service config as `<flag>: <message>` (deploy/serve_flags.flag_for)."""
    from deploy.serve_flags import flag_for

    first = err.errors()[0]
    cause = (first.get("ctx") or {}).get("error")
    if isinstance(cause, InvalidRequestError):  # a cross-field check, e.g. the policy against the drafters
        return f"{flag_for((cause.field,)) or cause.field}: {cause.message}"
    location = first.get("loc", ())
    where = flag_for(location) or ".".join(map(str, location))
    message = str(first.get("msg")).removeprefix("Value error, ")
    return f"{where}: {message}" if where else message


def main(argv: list[str] | None = None) -> int:
    from pydantic import ValidationError

    logging.basicConfig(level=logging.WARNING)
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except InvalidRequestError as err:
        from deploy.serve_flags import flag_for

        where = flag_for((err.field,)) if args.command == "serve" else None
        print(f"error: {where}: {err.message}" if where else f"error: {err}", file=sys.stderr)
        return 2
    except ValidationError as err:
        print(f"error: {config_error(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # not the user's input: one line, the traceback on request
        if os.environ.get("SPECFLEET_DEBUG"):
            raise
        print(f"error: {type(err).__name__}: {err} (SPECFLEET_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
