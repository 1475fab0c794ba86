"""The soak's verdict with replicas killed: a request that was on a replica killed while it ran,
ending within 10 s with the front's "target replica is unavailable", is lost with its replica
(expected); the same failure at any other time, or any other failure, is unexpected; a kill
that finds no replacement running fails the soak (no Ray needed)."""
import json

import pytest
import requests

from deploy.bench.soak import REPLICA_LOST, Soak, Unexpected, expect, verdict
from deploy.service.front import REPLICA_UNAVAILABLE
from deploy.service.openai_api import error_body


def soak() -> Soak:
    return Soak("http://127.0.0.1:1", "key", "admin", "smollm2-135m", [], 1 << 20, seed=0)


def reply(status: int, message: str) -> requests.Response:
    answer = requests.Response()
    answer.status_code = status
    answer._content = json.dumps(error_body(message, None, status, "service_unavailable_error")).encode()
    return answer


def report(**fields) -> dict:
    return {"unexpected": {}, "left_open": {"coordinator_requests": 0, "drafter_sessions": {}}, "chaos": [],
            "memory": {}, "memory_bound_mib": 64} | fields


def test_a_request_on_a_replica_killed_while_it_ran_is_lost_with_it_only_if_it_ended_soon_after():
    run = soak()
    run.kills.append(100.0)
    assert run.killed_during(95.0, 104.0)
    assert not run.killed_during(95.0, 111.0)  # ended over 10 s after the kill: not clean
    assert not run.killed_during(101.0, 104.0)  # sent after the kill: should have gone to the survivor
    assert not run.killed_during(60.0, 90.0)


def test_the_fronts_503_for_a_lost_replica_is_told_apart_from_other_5xx():
    with pytest.raises(Unexpected) as lost:
        expect(reply(503, REPLICA_UNAVAILABLE), 200)
    assert lost.value.reason == REPLICA_LOST
    with pytest.raises(Unexpected) as overloaded:
        expect(reply(503, "the service is overloaded"), 200)
    assert overloaded.value.reason == "5xx"


def test_a_kill_that_finds_no_replacement_running_fails_the_soak_and_clean_kills_do_not():
    assert verdict(report(replica_kills=["killed abc", "killed def"])) == []
    failed = verdict(report(replica_kills=["killed abc", "no second replica running: ..."]))
    assert len(failed) == 1 and "no second replica" in failed[0]
