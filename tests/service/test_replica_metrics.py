"""One scrape shows every replica: a replica's exposition merged with the families the other
replicas published holds each metric family once, with every replica's samples under its own
`replica` label, and parses as valid Prometheus text (no Ray, no model)."""
import pickle

from prometheus_client.parser import text_string_to_metric_families

from deploy.engine.request import GenerationResult, RoundTrace
from deploy.service.metrics import ServiceMetrics


def finished(tokens: int, drafter: str = "ngram") -> GenerationResult:
    rounds = [RoundTrace(drafter, 4, 2, 3, 1.0, 0.01, 0.05, 0.005, 0.005)]
    return GenerationResult(text="x" * tokens, token_ids=list(range(tokens)), prompt_tokens=5, rounds=rounds,
                            finish_reason="length")


def replica(name: str, requests: int) -> ServiceMetrics:
    metrics = ServiceMetrics("smollm2-135m", name)
    for _ in range(requests):
        metrics.request_waiting()
        metrics.request_started()
        metrics.observe(finished(8), ttft_s=0.1, e2e_s=1.0)
        metrics.request_finished()
    return metrics


def test_a_scrape_holds_every_replicas_series_each_family_once():
    first, second = replica("a", 2), replica("b", 3)
    published = pickle.loads(pickle.dumps(second.families()))  # as it travels through the coordinator
    families = list(text_string_to_metric_families(first.render([published]).decode()))
    names = [family.name for family in families]
    assert len(names) == len(set(names))  # a family twice is invalid exposition
    requests = {s.labels["replica"]: s.value for family in families for s in family.samples
                if s.name == "specfleet:request_success_total"}
    assert requests == {"a": 2, "b": 3}
    tokens = [s for family in families for s in family.samples if s.name == "specfleet:generation_tokens_total"]
    assert sorted((s.labels["replica"], s.value) for s in tokens) == [("a", 16), ("b", 24)]


def test_a_lone_replica_renders_what_it_always_did():
    alone = replica("a", 1)
    assert alone.render() == alone.render([])
    assert {s.labels["replica"] for family in text_string_to_metric_families(alone.render().decode())
            for s in family.samples} == {"a"}
