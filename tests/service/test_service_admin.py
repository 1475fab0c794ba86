"""The admin API on the running Ray service: always behind the admin token (never an API key),
it lists the pool, adds a drafter actor as a live arm and drains one out, and turns bad input into
OpenAI-style errors naming the field; answers stay equal to plain decoding throughout."""
import json
import urllib.error
import urllib.request

import pytest

from actors.no_draft import NO_DRAFT
from tests.conftest import CHAT_PROMPTS, chat_text, plain_text

pytestmark = [pytest.mark.model, pytest.mark.ray]
MAX_TOKENS = 24


def admin(service, method: str, path: str, body: dict | None = None, token: str | None = "") -> tuple[int, dict]:
    """Call /admin/*; sends the admin token unless `token` is given (None: no header)."""
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token or service.admin_token}"
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{service.url}/admin{path}", data=data, headers=headers, method=method)
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def plain(target):
    return plain_text(target, CHAT_PROMPTS[0], MAX_TOKENS)


def ask(service) -> str:
    return chat_text(service.url, CHAT_PROMPTS[0], MAX_TOKENS, service.api_key)


@pytest.mark.parametrize("token, problem", [(None, "missing"), ("wrong-token", "invalid")])
def test_the_admin_api_refuses_a_caller_without_the_admin_token(service, token, problem):
    status, body = admin(service, "GET", "/drafters", token=token)
    assert status == 401 and problem in body["error"]["message"]


def test_an_api_key_is_not_an_admin_token(service):
    status, _ = admin(service, "GET", "/drafters", token=service.api_key)
    assert status == 401


def test_the_admin_api_lists_the_pool_with_placement_and_statistics(service):
    status, body = admin(service, "GET", "/drafters")
    assert status == 200
    drafters = {d["name"]: d for d in body["data"]}
    assert set(drafters) == {"ngram", "suffix", "hierarchy", NO_DRAFT}
    for d in drafters.values():
        assert {"name", "kind", "model", "node", "gpu", "status", "pulls", "acceptance"} <= set(d)
        assert d["status"] == "up" and d["node"] and d["node_ip"]


@pytest.mark.parametrize("body, status, param", [
    ({"name": "x", "kind": "telepathy"}, 400, "kind"),
    ({"kind": "ngram"}, 400, "name"),
    ({"name": "bad name!", "kind": "ngram"}, 400, "name"),
    ({"name": "x", "kind": "hf"}, 400, None),  # an hf drafter needs a model
    ({"name": "ngram", "kind": "ngram"}, 409, "name"),  # taken
])
def test_bad_drafter_additions_get_errors_naming_the_field(service, body, status, param):
    got, answer = admin(service, "POST", "/drafters", body)
    assert got == status and answer["error"]["param"] == param


def test_removing_an_unknown_drafter_is_a_404(service):
    status, body = admin(service, "DELETE", "/drafters/nobody")
    assert status == 404 and body["error"]["param"] == "name"


def test_a_drafter_added_live_serves_as_an_arm_and_drains_out_on_removal(service, plain):
    status, placed = admin(service, "POST", "/drafters", {"name": "ngram-live", "kind": "ngram"})
    assert status == 201 and placed["name"] == "ngram-live" and placed["node"]
    answers = [ask(service) for _ in range(3)]  # UCB tries the new, untried arm in these requests
    _, listed = admin(service, "GET", "/drafters")
    live = next(d for d in listed["data"] if d["name"] == "ngram-live")
    assert live["pulls"] > 0  # the bandit explored it
    status, _ = admin(service, "DELETE", "/drafters/ngram-live")
    assert status == 200
    _, listed = admin(service, "GET", "/drafters")
    assert "ngram-live" not in {d["name"] for d in listed["data"]}
    answers.append(ask(service))
    assert answers == [plain] * 4


def test_your_own_specialist_built_from_a_file_joins_the_running_pool_as_an_arm(service, plain, tmp_path, monkeypatch,
                                                                              capsys):
    """`specfleet specialists --from FILE --name NAME`, then `specfleet drafters add`: MetaSD on one's
    own traffic. The file holds a request (the target answers it) and a text: the answer `ask` gets."""
    import shutil
    import uuid

    from actors.specialists import specialists_root
    from deploy.cli import main

    name = f"test_own_{uuid.uuid4().hex[:8]}"
    source = tmp_path / "mine.jsonl"
    source.write_text(json.dumps({"prompt": "Name three colours."}) + "\n" + json.dumps({"text": plain}) + "\n")
    drafter = f"retrieval-{name}"
    monkeypatch.setenv("SPECFLEET_ADMIN_TOKEN", service.admin_token)
    try:
        assert main(["specialists", "--from", str(source), "--name", name]) == 0
        assert main(["drafters", "add", drafter, "--kind", drafter, "--url", service.url]) == 0
        assert f"added {drafter}" in capsys.readouterr().out
        answers = [ask(service) for _ in range(3)]
        _, listed = admin(service, "GET", "/drafters")
        mine = next(d for d in listed["data"] if d["name"] == drafter)
        assert mine["pulls"] > 0 and mine["acceptance"] > 0.5  # it holds this very answer
        assert main(["drafters", "remove", drafter, "--url", service.url]) == 0
        assert answers == [plain] * 3
    finally:
        shutil.rmtree(specialists_root() / name, ignore_errors=True)


@pytest.fixture(scope="module")
def eagle_head_dir(target, tmp_path_factory):
    """An eagle head trained on the target's own answer to the prompt `ask` sends (a fresh directory:
    the user's trained head, if any, is not touched)."""
    from deploy.specialists.corpus import target_outputs
    from deploy.specialists.eagle import train_eagle

    out = tmp_path_factory.mktemp("eagle") / "head"
    train_eagle(target, target_outputs(target, CHAT_PROMPTS[:1], max_new_tokens=MAX_TOKENS), out, epochs=40, lr=3e-3,
                heldout=0.0)
    return str(out)


def test_an_eagle_drafter_added_live_drafts_from_the_targets_features_sent_through_the_coordinator(
        service, plain, eagle_head_dir):
    status, placed = admin(service, "POST", "/drafters", {"name": "eagle", "kind": "eagle", "model": eagle_head_dir})
    assert status == 201 and placed["kind"] == "eagle"
    answers = [ask(service) for _ in range(4)]
    _, listed = admin(service, "GET", "/drafters")
    eagle = next(d for d in listed["data"] if d["name"] == "eagle")
    # the head learnt this answer, so features that line up with the tokens get its drafts accepted
    # (a misaligned or missing feature stream scores near 0 on a 49k vocabulary); earlier tests leave
    # the suffix cache knowing this answer, so eagle gets few, short pulls and a loose floor
    assert eagle["pulls"] > 0 and eagle["acceptance"] > 0.25
    status, _ = admin(service, "DELETE", "/drafters/eagle")
    assert status == 200
    answers.append(ask(service))
    assert answers == [plain] * 5
