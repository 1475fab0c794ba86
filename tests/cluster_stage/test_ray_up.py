"""The deployment path end to end on loopback, with the runbook's commands (docs/cluster.md): `ray up` the loopback variant of ray_config.yaml over SSH to 127.0.0.1 (rsync the
project, `make install`, start the head with token authentication), `ray rsync-up` specfleet's
secrets to the head, `serve deploy` the config `specfleet serve --print-config` writes there (API
keys on), get one keyed generation over HTTP equal to plain decoding (401 without a key), `specfleet status`,
then `ray down` leaving no Ray process behind."""
from __future__ import annotations

import secrets
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from tests.conftest import CHAT_PROMPTS, chat_text, plain_text

pytestmark = [pytest.mark.cluster, pytest.mark.model]

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))
URL = "http://127.0.0.1:8000"  # deploy/serve_config.yaml's http_options
MAX_TOKENS = 24
SECRETS = [Path("~/.specfleet/admin_token").expanduser(), Path("~/.specfleet/api_keys").expanduser()]
RAY_PROCESSES = ("raylet", "gcs_server", "ray::", "dashboard.py", "monitor.py", "log_monitor.py")


def run(*args: str, timeout: float = 600) -> str:
    done = subprocess.run(list(args), cwd=REPO, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"{' '.join(args)} failed:\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def ray_processes() -> list[str]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if any(name in line for name in RAY_PROCESSES):
            found.append(line[:120])
    return found


def wait_until_serving(timeout_s: float = 420) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{URL}/health", timeout=5) as answer:
                if answer.status == 200:
                    return
        except OSError:  # refused, reset or timed out while Serve deploys
            pass
        assert time.monotonic() < deadline, f"the service did not come up on {URL} in {timeout_s} s"
        time.sleep(2)


@pytest.fixture(scope="module")
def loopback_config(loopback_sshd, tmp_path_factory):
    """cluster/loopback.yaml with only `auth` pointed at the test's sshd; `ray up` on enter, `ray down` on exit."""
    assert not ray_processes(), "another Ray runs on this machine; the loopback cluster needs it stopped"
    config = yaml.safe_load((REPO / "cluster" / "loopback.yaml").read_text())
    config["auth"] = {"ssh_user": loopback_sshd.user, "ssh_private_key": str(loopback_sshd.private_key),
                      "ssh_proxy_command": loopback_sshd.proxy_command}
    path = tmp_path_factory.mktemp("cluster") / "loopback.yaml"
    path.write_text(yaml.safe_dump(config))
    run(RAY, "get-auth-token", "--generate")  # the runbook's first steps: the Ray token, specfleet's secrets
    created = [secret for secret in SECRETS if not secret.is_file()]
    for secret in created:
        secret.parent.mkdir(mode=0o700, exist_ok=True)
        secret.write_text(secrets.token_urlsafe(32) + "\n")
        secret.chmod(0o600)
    try:
        run(RAY, "up", "-y", "--no-config-cache", str(path), timeout=900)
        # the head alone; the source as a shell expands it, the target's ~ left to the head's shell
        run(RAY, "rsync-up", str(path), f"{SECRETS[0].parent}/", "~/.specfleet/")
        yield str(path)
    finally:
        run(RAY, "down", "-y", str(path))
        for secret in created:
            secret.unlink()


@pytest.fixture(scope="module")
def plain(target):
    return plain_text(target, CHAT_PROMPTS[1], MAX_TOKENS)


def test_ray_up_serve_deploy_answers_exactly_then_ray_down_leaves_nothing(loopback_config, plain):
    run(RAY, "exec", loopback_config, "specfleet serve --api-key-file ~/.specfleet/api_keys --print-config "
                                      "> ~/serve.yaml && serve deploy ~/serve.yaml")
    wait_until_serving()
    api_key = SECRETS[1].read_text().split()[0]
    assert chat_text(URL, CHAT_PROMPTS[1], MAX_TOKENS, api_key) == plain
    with pytest.raises(urllib.error.HTTPError) as refused:  # the runbook's service is keyed
        urllib.request.urlopen(f"{URL}/v1/models", timeout=30)
    assert refused.value.code == 401

    run(RAY, "exec", loopback_config, "specfleet drafters add ngram-2 --kind ngram")
    assert "ngram-2" in run(RAY, "exec", loopback_config, "specfleet drafters list")
    status = run(RAY, "exec", loopback_config, "specfleet status")
    assert "target replicas (1)" in status and "drafters (5/5 up)" in status
    metrics = run(RAY, "exec", loopback_config, "curl -s 127.0.0.1:8000/metrics")
    served = [line for line in metrics.splitlines() if line.startswith("specfleet:e2e_request_latency_seconds_count")]
    assert served and float(served[0].split()[-1]) >= 1  # the request above, counted

    run(RAY, "down", "-y", loopback_config)
    deadline = time.monotonic() + 60
    while (left := ray_processes()) and time.monotonic() < deadline:
        time.sleep(1)
    assert not left, f"Ray processes left after ray down: {left}"
