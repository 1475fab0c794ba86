"""The drafter list becomes Ray resource requests: one GPU per model drafter on a GPU cluster, none
on a CPU one or for a lookup drafter, overrides and custom resources respected, one bundle per
resource-holding drafter; lookups that ask for nothing draft in the coordinator; the service
config names a bad placement or resource field."""
import pytest
from pydantic import ValidationError

from cluster.drafter_actor import DrafterSpec
from cluster.resources import bundle, bundle_indices, drafter_gpus, drafts_in_coordinator, target_gpus
from deploy.config import ServiceConfig


def test_each_model_drafter_gets_a_gpu_of_its_own_on_a_gpu_cluster():
    assert [drafter_gpus(kind, model, None, cluster_gpus=4) for kind, model in
            (("hf", "/models/small"), ("eagle", None), ("distill-code", None), ("hierarchy", "/models/small"))] == [1.0] * 4


def test_lookup_drafters_the_no_draft_arm_and_a_cpu_cluster_ask_for_no_gpu():
    assert [drafter_gpus(kind, None, None, cluster_gpus=4) for kind in
            ("ngram", "suffix", "hierarchy", "retrieval-code", "none")] == [0.0] * 5
    assert drafter_gpus("hf", "/models/small", None, cluster_gpus=0) == 0.0
    assert target_gpus(None, cluster_gpus=0) == 0.0 and target_gpus(None, cluster_gpus=2) == 1.0


def test_an_explicit_gpu_count_wins_over_the_default():
    assert drafter_gpus("ngram", None, 1.0, cluster_gpus=8) == 1.0
    assert drafter_gpus("hf", "/models/small", 0.5, cluster_gpus=0) == 0.5
    assert target_gpus(2.0, cluster_gpus=8) == 2.0


def test_lookup_drafters_that_ask_for_nothing_draft_in_the_coordinator_and_the_rest_in_actors():
    hosted = [DrafterSpec("ngram", "ngram"), DrafterSpec("suffix", "suffix"), DrafterSpec("h", "hierarchy"),
              DrafterSpec("none", "none"), DrafterSpec("r", "retrieval-code")]
    actors = [DrafterSpec("small", "hf", "/models/small"), DrafterSpec("eagle", "eagle"),
              DrafterSpec("h", "hierarchy", "/models/small"), DrafterSpec("s", "suffix", num_cpus=1.0),
              DrafterSpec("n", "ngram", resources=(("specfleet_drafter", 1.0),))]
    assert all(drafts_in_coordinator(d) for d in hosted)
    assert not any(drafts_in_coordinator(d) for d in actors)


def test_only_drafters_that_ask_for_resources_get_a_bundle_in_pool_order():
    pool = [DrafterSpec("ngram", "ngram", num_gpus=1.0), DrafterSpec("none", "none"),
            DrafterSpec("small", "hf", "/models/small", num_gpus=1.0, num_cpus=2.0, resources=(("specfleet_drafter", 1.0),))]
    assert [bundle(d) for d in pool] == [{"GPU": 1.0}, {}, {"GPU": 1.0, "CPU": 2.0, "specfleet_drafter": 1.0}]
    assert bundle_indices(pool) == {"ngram": 0, "small": 1}


def test_the_config_takes_a_placement_strategy_and_custom_resources():
    config = ServiceConfig.model_validate({
        "placement": {"strategy": "SPREAD", "timeout_s": 30},
        "target": {"resources": {"specfleet_target": 1}},
        "drafters": [{"name": "ngram", "kind": "ngram", "resources": {"specfleet_drafter": 1}}]})
    assert config.placement.strategy == "SPREAD"
    assert config.drafters[0].resources == {"specfleet_drafter": 1.0}


@pytest.mark.parametrize("args, field", [
    ({"placement": {"strategy": "EVERYWHERE"}}, "placement.strategy"),
    ({"placement": {"timeout_s": 0}}, "placement.timeout_s"),
    ({"target": {"num_gpus": -1}}, "target.num_gpus"),
    ({"drafters": [{"name": "n", "kind": "ngram", "resources": {"x": "lots"}}]}, "drafters.0.resources.x"),
])
def test_a_bad_placement_or_resource_setting_names_its_field(args, field):
    with pytest.raises(ValidationError) as caught:
        ServiceConfig.model_validate(args)
    assert field in {".".join(str(part) for part in e["loc"]) for e in caught.value.errors()}
