"""The deployment path end to end on loopback, with the runbook's commands (docs/cluster.md): `ray up` the loopback variant of ray_config.yaml over SSH to 127.0.0.1 (rsync the
project, `make install`, start the head with token authentication), `serve deploy` the service
config on the head, get one generation over HTTP equal to plain decoding, `specfleet status`,
then `ray down` leaving no Ray process behind."""
from __future__ import annotations

import secrets
import subprocess
import sys
import time
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
    run(RAY, "get-auth-token", "--generate")  # the runbook's first steps: the Ray token, the admin token
    admin_token = Path("~/.specfleet/admin_token").expanduser()
    if not admin_token.is_file():
        admin_token.parent.mkdir(mode=0o700, exist_ok=True)
        admin_token.write_text(secrets.token_urlsafe(32) + "\n")
        admin_token.chmod(0o600)
    try:
        run(RAY, "up", "-y", "--no-config-cache", str(path), timeout=900)
        yield str(path)
    finally:
        run(RAY, "down", "-y", str(path))


@pytest.fixture(scope="module")
def plain(target):
    return plain_text(target, CHAT_PROMPTS[1], MAX_TOKENS)


def test_ray_up_serve_deploy_answers_exactly_then_ray_down_leaves_nothing(loopback_config, plain):
    run(RAY, "exec", loopback_config,
        "serve deploy ~/specfleet/deploy/serve_config.yaml")
    wait_until_serving()
    assert chat_text(URL, CHAT_PROMPTS[1], MAX_TOKENS) == plain

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
