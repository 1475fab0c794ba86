"""`specfleet bench`: specfleet's runs, its peers and its service side by side in one run.

runs.py orchestrates (run names, interleaving, the concurrency sweep); engines.py builds a run's engine; prompts.py reads prompt
files; peers.py runs Hugging Face transformers' decoding; service.py drives the HTTP service;
report.py builds the JSON rows (docs/design.md), the oracle, the summary and the Markdown table;
charts.py draws the PNGs.
"""
from deploy.bench.engines import make_engine
from deploy.bench.prompts import MIXED_PROMPTS, TASK_SWITCH_PROMPTS, BenchPrompt, load_prompts
from deploy.bench.report import render_table
from deploy.bench.runs import DEFAULT_RUNS, expand_runs, parse_concurrency, run_bench
from deploy.bench.sample import Sample

DEFAULT_PROMPTS = MIXED_PROMPTS

__all__ = ["DEFAULT_PROMPTS", "DEFAULT_RUNS", "MIXED_PROMPTS", "TASK_SWITCH_PROMPTS", "BenchPrompt", "Sample",
           "expand_runs", "load_prompts", "make_engine", "parse_concurrency", "render_table", "run_bench"]
