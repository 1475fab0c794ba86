"""Prometheus metrics of the service (names of docs/design.md, mirroring vLLM, plus a `drafter` label).

`ServiceMetrics.observe(result, ttft_s, e2e_s)` records one finished request (`observe_work(result)`
one abandoned by its client: `request_success_total{finished_reason="abort"}`); `render()` returns the
Prometheus text exposition. Each replica has its own registry, and every sample carries the labels
`model_name` (the served name, as vLLM's dashboards expect) and `replica` (the replica that
counted it, so series from several replicas never mix); nothing secret is ever a label. With
several replicas, a scrape answers every replica's series: `families()` are what a replica
publishes (deploy/service/server.py, through the coordinator) and `render(others)` merges the
other replicas' last published families into this replica's exposition, family by family.
A multi-draft round's `drafter` label joins its drafters with '+' (its drafted tokens are a tree's
nodes, not one drafter's); `bandit_arm_pulls_total` counts each of them. `target_forwards_total`
counts verification forwards (one per round; the prompt's prefill is not counted), so
generation_tokens / target_forwards is tokens per forward. The request gauges move with
`request_waiting()` (accepted), `request_started()` (generating) and `request_finished()`;
they are safe to call from any thread. deploy/grafana/specfleet-dashboard.json queries these names.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from deploy.engine.request import GenerationResult

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _Labelled:
    """A registry's samples with constant labels added (a collector for generate_latest)."""

    def __init__(self, registry: CollectorRegistry, labels: dict[str, str]) -> None:
        self.registry, self.labels = registry, labels

    def collect(self):
        for family in self.registry.collect():
            labelled = Metric(family.name, family.documentation, family.type, family.unit)
            for sample in family.samples:
                labelled.add_sample(sample.name, sample.labels | self.labels, sample.value, sample.timestamp,
                                    sample.exemplar)
            yield labelled


class ServiceMetrics:
    def __init__(self, model_name: str = "", replica: str = "") -> None:
        self.labels = {"model_name": model_name, "replica": replica}
        self.registry = CollectorRegistry()
        r = self.registry
        self.drafts = Counter("specfleet:spec_decode_num_drafts", "Rounds with a draft", ["drafter"], registry=r)
        self.draft_tokens = Counter("specfleet:spec_decode_num_draft_tokens", "Drafted tokens", ["drafter"], registry=r)
        self.accepted = Counter("specfleet:spec_decode_num_accepted_tokens", "Accepted draft tokens", ["drafter"], registry=r)
        self.accepted_per_pos = Counter("specfleet:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by position", ["drafter", "position"], registry=r)
        self.pulls = Counter("specfleet:bandit_arm_pulls", "Rounds each arm was chosen", ["drafter"], registry=r)
        self.draft_s = Histogram("specfleet:draft_seconds", "Coordinator round trip incl. drafting", ["drafter"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.verify_s = Histogram("specfleet:verify_seconds", "Target forward + verification",
                                  buckets=_LATENCY_BUCKETS, registry=r)
        self.overhead_s = Histogram("specfleet:coordinator_overhead_seconds",
                                    "Round trip minus the slowest drafter's own drafting time",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.ttft = Histogram("specfleet:time_to_first_token_seconds", "Time to first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("specfleet:e2e_request_latency_seconds", "End-to-end request latency",
                             buckets=_LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("specfleet:prompt_tokens", "Prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("specfleet:generation_tokens", "Generated tokens", registry=r)
        self.target_forwards = Counter("specfleet:target_forwards",
                                       "Target verification forwards (one per round; prefill not counted)", registry=r)
        self.request_success = Counter("specfleet:request_success", "Finished requests", ["finished_reason"],
                                       registry=r)
        self.running = Gauge("specfleet:num_requests_running", "Requests generating on this replica", registry=r)
        self.waiting = Gauge("specfleet:num_requests_waiting", "Requests accepted by this replica, not yet generating",
                             registry=r)

    def request_waiting(self) -> None:
        self.waiting.inc()

    def request_started(self) -> None:
        self.waiting.dec()
        self.running.inc()

    def request_finished(self, started: bool = True) -> None:
        """A request left the replica (done, failed or cancelled); `started=False` when it never generated."""
        (self.running if started else self.waiting).dec()

    def observe(self, result: GenerationResult, ttft_s: float | None, e2e_s: float) -> None:
        self.observe_work(result)
        if ttft_s is not None:
            self.ttft.observe(ttft_s)
        self.e2e.observe(e2e_s)

    def observe_work(self, result: GenerationResult) -> None:
        """What a request cost and drafted, without latencies: alone for one its client abandoned
        (finished_reason "abort"), whose latency nobody saw."""
        for r in result.rounds:
            for arm in r.drafter.split("+"):  # a multi-draft round pulls each of its arms
                self.pulls.labels(arm).inc()
            self.draft_s.labels(r.drafter).observe(r.draft_s)
            self.verify_s.observe(r.verify_s)
            self.overhead_s.observe(max(r.draft_s - r.drafter_s, 0.0))
            if r.drafted:
                self.drafts.labels(r.drafter).inc()
                self.draft_tokens.labels(r.drafter).inc(r.drafted)
                self.accepted.labels(r.drafter).inc(r.accepted)
                for position in range(r.accepted):
                    self.accepted_per_pos.labels(r.drafter, str(position)).inc()
        self.prompt_tokens.inc(result.prompt_tokens)
        self.generation_tokens.inc(len(result.token_ids))
        self.target_forwards.inc(len(result.rounds))
        self.request_success.labels(result.finish_reason).inc()

    def families(self) -> list[Metric]:
        """This replica's metric families, every sample labelled (what it publishes to the others)."""
        return list(_Labelled(self.registry, self.labels).collect())

    def render(self, others: Iterable[Sequence[Metric]] = ()) -> bytes:
        """The Prometheus text exposition of this replica's metrics and `others` (other replicas'
        `families()`): one family per name holding every replica's samples."""
        return generate_latest(_Merged([self.families(), *others]))


class _Merged:
    """Several replicas' metric families as one collector: each name once, with every replica's samples."""

    def __init__(self, groups: Sequence[Sequence[Metric]]) -> None:
        self.groups = groups

    def collect(self):
        merged: dict[str, Metric] = {}
        for families in self.groups:
            for family in families:
                into = merged.get(family.name)
                if into is None:
                    into = merged[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                into.samples.extend(family.samples)
        yield from merged.values()
