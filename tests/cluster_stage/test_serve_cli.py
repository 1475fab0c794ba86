"""`specfleet serve MODEL --flags` as a user runs it, in its own process: on first start it creates
the admin token (0600), serves the flags' model name, pool and policy (a streamed chat equal to
plain decoding; `specfleet drafters list` through SPECFLEET_URL), and a SIGTERM ends it with exit
status 0, no Ray stack dump and no process of its own left. It starts a local Ray of its own, so
it runs in this stage, after the clusters of the other tests are down."""
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from actors.models import cache_root
from tests.conftest import CHAT_PROMPTS, free_ports, plain_text

pytestmark = [pytest.mark.cluster, pytest.mark.model]
SPECFLEET = str(Path(sys.executable).with_name("specfleet"))
MAX_TOKENS = 24


def wait_until_healthy(url: str, process: subprocess.Popen, timeout_s: float = 420) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"specfleet serve exited early ({process.returncode}): {process.stdout.read()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5):
                return
        except OSError:
            time.sleep(2)
    pytest.fail("specfleet serve did not come up")


def own_processes(session_id: int) -> list[str]:
    """Processes still in the serve process's session, or naming its Ray session directory."""
    left = []
    for process in psutil.process_iter(["pid", "cmdline"]):
        try:
            in_session = os.getsid(process.pid) == session_id
        except OSError:
            continue
        cmdline = " ".join(process.info["cmdline"] or [])
        if in_session or f"_{session_id}/" in cmdline:
            left.append(f"{process.pid} {cmdline[:120]}")
    return left


def test_serve_with_flags_answers_as_configured_then_sigterm_leaves_nothing(tmp_path, target):
    from openai import OpenAI

    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECFLEET_ADMIN", "SPECFLEET_API", "RAY_ADDRESS"))}
    env |= {"HOME": str(home), "SPECFLEET_CACHE": str(cache_root())}  # a fresh home: no admin token yet
    port, grpc_port = free_ports(2)
    serve = subprocess.Popen(
        [SPECFLEET, "serve", "smollm2-135m", "--drafters", "ngram,suffix,none", "--policy", "thompson",
         "--verify", "tree", "--served-model-name", "smol", "--k", "2", "--max-padding", "0",  # few sizes to time
         "--port", str(port), "--grpc-port", str(grpc_port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, serve)
        token = home / ".specfleet" / "admin_token"
        assert token.is_file() and token.stat().st_mode & 0o777 == 0o600
        client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        assert [m.id for m in client.models.list().data] == ["smol"]
        pieces = [chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="smol", messages=CHAT_PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0, stream=True) if chunk.choices]
        assert "".join(pieces) == plain_text(target, CHAT_PROMPTS[0], MAX_TOKENS)
        listed = subprocess.run([SPECFLEET, "drafters", "list", "--json"], env=env | {"SPECFLEET_URL": url},
                                capture_output=True, text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr
        assert sorted(d["name"] for d in json.loads(listed.stdout)) == ["ngram", "none", "suffix"]
    finally:
        serve.send_signal(signal.SIGTERM)
        output, _ = serve.communicate(timeout=180)
    assert serve.returncode == 0, output[-3000:]
    assert "SIGTERM received" not in output and "Traceback" not in output
    assert "policy thompson, verify tree, drafters ngram,suffix,none" in output
    deadline = time.monotonic() + 30  # Ray's processes take a moment to go
    while own_processes(serve.pid) and time.monotonic() < deadline:
        time.sleep(1)
    assert own_processes(serve.pid) == []
