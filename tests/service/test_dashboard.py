"""The shipped Grafana dashboard (deploy/grafana/specfleet-dashboard.json) is valid Grafana JSON, has
every panel the service's operators need, and queries only metrics the service exports: the
exposition of a ServiceMetrics that observed real requests (real target, real drafters)."""
import json
from pathlib import Path

import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from actors.pool import build_drafters
from actors.sampling import SamplingParams
from deploy.engine.cost_model import ForwardCosts, max_positions
from deploy.engine.engine import SpeculativeEngine
from deploy.service.metrics import ServiceMetrics
from tests.conftest import CHAT_PROMPTS

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "specfleet-dashboard.json"
DATASOURCE = "${DS_PROMETHEUS}"
K = 4

# what the issue asks the dashboard to show: (a word of the panel's title, a metric the panel queries)
REQUIRED_PANELS = {
    "acceptance by drafter": ("acceptance", "specfleet:spec_decode_num_accepted_tokens_total"),
    "acceptance by position": ("position", "specfleet:spec_decode_num_accepted_tokens_per_pos_total"),
    "bandit pulls by drafter": ("pulls", "specfleet:bandit_arm_pulls_total"),
    "tokens per forward": ("per forward", "specfleet:target_forwards_total"),
    "draft time": ("draft time", "specfleet:draft_seconds_bucket"),
    "verify time": ("verify time", "specfleet:verify_seconds_bucket"),
    "coordinator overhead": ("coordinator", "specfleet:coordinator_overhead_seconds_bucket"),
    "TTFT": ("ttft", "specfleet:time_to_first_token_seconds_bucket"),
    "latency": ("latency", "specfleet:e2e_request_latency_seconds_bucket"),
    "running": ("running", "specfleet:num_requests_running"),
    "waiting": ("waiting", "specfleet:num_requests_waiting"),
}


@pytest.fixture(scope="module")
def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


@pytest.fixture(scope="module")
def served(target):
    """Two real greedy requests (the second one's answer is in the suffix cache, so drafts are
    accepted) observed by one ServiceMetrics, with the request gauges moved as the server does.
    No cost profiling (a minute on 2 cores): nothing is cut, every draft is verified whole."""
    engine = SpeculativeEngine(target, build_drafters(["ngram", "suffix"], None, target.vocab_size),
                               policy="metasd-ucb", verify="tree", k=K, costs=ForwardCosts(None, max_positions(K), 0))
    metrics = ServiceMetrics()
    results = []
    for _ in range(2):
        metrics.request_waiting()
        metrics.request_started()
        results.append(engine.generate(messages=CHAT_PROMPTS[0], sampling=SamplingParams(max_tokens=12)))
        metrics.observe(results[-1], ttft_s=0.1, e2e_s=1.0)
        metrics.request_finished()
    return metrics, results


def samples(metrics: ServiceMetrics) -> list:
    return [s for family in text_string_to_metric_families(metrics.render().decode()) for s in family.samples]


def value(metrics: ServiceMetrics, name: str, **labels: str) -> float:
    return sum(s.value for s in samples(metrics) if s.name == name and all(s.labels.get(k) == v
                                                                            for k, v in labels.items()))


def exprs(panel: dict) -> list[str]:
    return [t["expr"] for t in panel["targets"]]


def queried_metrics(expr: str) -> set[str]:
    """The metric names a PromQL expression selects, from its parse tree (Grafana's range variable
    replaced by a range, as Grafana does); a syntax error raises."""
    def walk(node) -> set[str]:
        kind = type(node).__name__
        if kind == "VectorSelector":
            return {node.name}
        if kind == "MatrixSelector":
            return walk(node.vector_selector)
        children = [getattr(node, attr, None) for attr in ("lhs", "rhs", "expr", "param")]
        children += list(getattr(node, "args", None) or ())
        return set().union(*(walk(child) for child in children if child is not None and not isinstance(child, (str, int, float))))

    return walk(promql_parser.parse(expr.replace("$__rate_interval", "5m")))


def test_the_dashboard_is_grafana_json_with_a_prometheus_datasource_variable(dashboard):
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["title"] and dashboard["uid"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    panels = dashboard["panels"]
    assert panels and len({p["id"] for p in panels}) == len(panels)
    for panel in panels:
        assert panel["title"] and panel["type"] and panel["targets"], panel.get("title")
        assert set(panel["gridPos"]) == {"x", "y", "w", "h"} and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        assert panel["datasource"]["uid"] == DATASOURCE
        for target in panel["targets"]:
            assert target["expr"] and target["refId"] and target["datasource"]["uid"] == DATASOURCE
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
    assert "model" not in variables and not any("model" in e for p in panels for e in exprs(p))  # any served model


@pytest.mark.model
def test_every_panel_queries_a_metric_the_service_exports(dashboard, served):
    exported = {s.name for s in samples(served[0])}
    for panel in dashboard["panels"]:
        for expr in exprs(panel):
            names = queried_metrics(expr)
            assert names, f"{panel['title']}: {expr} queries no specfleet metric"
            assert names <= exported, f"{panel['title']}: {sorted(names - exported)} not exported"


def test_the_query_parser_sees_every_selected_metric_and_refuses_bad_promql():
    assert queried_metrics("sum(rate(specfleet:a_total[$__rate_interval])) / sum(rate(specfleet:b_total[5m]))") == {
        "specfleet:a_total", "specfleet:b_total"}
    with pytest.raises(ValueError):
        queried_metrics("sum(rate(specfleet:a_total[5m])")


def test_every_panel_the_issue_names_is_on_the_dashboard(dashboard):
    for need, (word, metric) in REQUIRED_PANELS.items():
        assert any(word in p["title"].lower() and any(metric in e for e in exprs(p)) for p in dashboard["panels"]), need


@pytest.mark.model
def test_a_request_moves_the_counters_by_what_it_generated(served):
    metrics, results = served
    assert value(metrics, "specfleet:generation_tokens_total") == sum(len(r.token_ids) for r in results)
    assert value(metrics, "specfleet:prompt_tokens_total") == sum(r.prompt_tokens for r in results)
    assert value(metrics, "specfleet:target_forwards_total") == sum(len(r.rounds) for r in results)
    for reason in {r.finish_reason for r in results}:
        assert value(metrics, "specfleet:request_success_total", finished_reason=reason) == sum(
            r.finish_reason == reason for r in results)
    rounds = [r for result in results for r in result.rounds]
    assert value(metrics, "specfleet:bandit_arm_pulls_total") == sum(len(r.drafter.split("+")) for r in rounds)
    assert value(metrics, "specfleet:spec_decode_num_accepted_tokens_per_pos_total") == sum(r.accepted for r in rounds) > 0
    assert value(metrics, "specfleet:verify_seconds_count") == len(rounds)
    assert value(metrics, "specfleet:e2e_request_latency_seconds_count") == len(results)


@pytest.mark.model
def test_the_request_gauges_return_to_zero_when_requests_finish(served):
    metrics = served[0]
    assert value(metrics, "specfleet:num_requests_running") == value(metrics, "specfleet:num_requests_waiting") == 0
    metrics = ServiceMetrics()
    metrics.request_waiting()
    metrics.request_waiting()
    metrics.request_started()
    assert (value(metrics, "specfleet:num_requests_running"), value(metrics, "specfleet:num_requests_waiting")) == (1, 1)
    metrics.request_finished()
    metrics.request_finished(started=False)  # the waiting one failed before it generated
    assert value(metrics, "specfleet:num_requests_running") == value(metrics, "specfleet:num_requests_waiting") == 0


def test_every_sample_names_the_served_model_and_the_replica_that_answered():
    metrics = ServiceMetrics(model_name="smol", replica="replica-7")
    metrics.request_waiting()
    metrics.pulls.labels("ngram").inc()
    labelled = samples(metrics)
    assert labelled and all(s.labels["model_name"] == "smol" and s.labels["replica"] == "replica-7" for s in labelled)
    assert value(metrics, "specfleet:bandit_arm_pulls_total", drafter="ngram", replica="replica-7") == 1
