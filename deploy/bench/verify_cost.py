"""What verifying m drafts of k tokens costs the target, two ways, measured side by side.

    python -m deploy.bench.verify_cost [--model smollm2-135m] [--context 256] [--k 7] [--out FILE.json]

- tree: one sequence of 1 + m*k positions (no shared prefixes: the worst case) with a tree
  attention mask over the shared cached prefix (what the engine does), then `keep` of a branch;
- batch: the cached prefix repeated m times (batch m), one forward over [m, k + 1], then the
  accepted row's cache kept (the alternative design);
- chain: one sequence of n positions, n = 1 .. 1 + max_m*k: the plain cost curve, whose slope
  decides where several drafts a round pay (a GPU's is nearly flat, a CPU's is not).

Prints a table and writes JSON: median seconds per forward, each relative to a 1-position step.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from actors.models import load_causal_lm
from deploy.engine.defaults import K
from deploy.engine.draft_tree import ROOT, DraftTree
from deploy.engine.target import TargetModel


def _median_s(step, repeats: int) -> float:
    step()  # warm-up
    times = []
    for _ in range(repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        start = time.perf_counter()
        step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(target: TargetModel, context: int, k: int, widths: list[int], repeats: int) -> dict:
    prefix = [(7 * i + 3) % target.vocab_size for i in range(context)]
    cache = target.new_cache()
    target.forward(cache, prefix[:-1], logits_for=0)

    def chain(n: int):
        def step():
            target.forward(cache, [prefix[-1]] + list(range(10, 10 + n - 1)), logits_for=n)
            target.crop(cache, context - 1)
        return step

    def tree(m: int):
        drafts = [[100 * (i + 1) + j for j in range(k)] for i in range(m)]
        built = DraftTree.build(drafts)
        parents = [-1] + [0 if p == ROOT else 1 + p for p in built.parents]

        def step():
            target.forward(cache, [prefix[-1], *built.tokens], logits_for=1 + built.size, parents=parents)
            target.keep(cache, context, [context + node for node in built.paths[-1][:2]])
            target.crop(cache, context - 1)
        return step

    def batch(m: int):
        def step():
            from transformers import DynamicCache

            copy = DynamicCache(config=target.model.config)
            for source, layer in zip(cache.layers, copy.layers):
                layer.lazy_initialization(source.keys, source.values)
                layer.keys, layer.values = source.keys.repeat(m, 1, 1, 1), source.values.repeat(m, 1, 1, 1)
            ids = torch.tensor([[prefix[-1]] + [100 * (i + 1) + j for j in range(k)] for i in range(m)],
                               device=target.device)
            with torch.inference_mode():
                target.model(input_ids=ids, past_key_values=copy, use_cache=True).logits.float().cpu()
                for layer in copy.layers:  # keep the accepted row (the last)
                    layer.keys, layer.values = layer.keys[-1:], layer.values[-1:]
        return step

    plain = _median_s(chain(1), repeats)
    out = {"context": context, "k": k, "plain_step_s": plain, "chain": {}, "tree": {}, "batch": {}}
    for n in range(1, 1 + max(widths) * k + 1):
        out["chain"][n] = _median_s(chain(n), repeats) / plain
    for m in widths:
        out["tree"][m] = _median_s(tree(m), repeats) / plain
        out["batch"][m] = _median_s(batch(m), repeats) / plain
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--k", type=int, default=K)
    parser.add_argument("--widths", default="1,2,3,4")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    target = TargetModel(load_causal_lm(args.model))
    result = measure(target, args.context, args.k, [int(w) for w in args.widths.split(",")], args.repeats)
    result["device"] = str(target.device)
    print(f"device {result['device']}, context {args.context}, k {args.k}, plain step {result['plain_step_s'] * 1e3:.1f} ms")
    print("m drafts | tree (1+m*k positions) | batch (m x (k+1)) | in plain steps")
    for m in result["tree"]:
        print(f"{m:8d} | {result['tree'][m]:22.2f} | {result['batch'][m]:17.2f} |")
    print("chain positions -> cost in plain steps: " + ", ".join(f"{n}:{c:.2f}" for n, c in result["chain"].items()))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
