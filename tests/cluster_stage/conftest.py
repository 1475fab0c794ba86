"""The cluster stage's processes join token-authenticated clusters (RAY_AUTH_MODE=token, like every
specfleet cluster): Ray reads the mode when it is first imported, so it is set before any test
module imports Ray; and a private sshd on loopback for `ray up`."""
from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_ports

os.environ["RAY_AUTH_MODE"] = "token"

SSHD = "/usr/sbin/sshd"


@dataclass(frozen=True)
class LoopbackSSH:
    user: str
    private_key: Path
    port: int

    @property
    def proxy_command(self) -> str:
        """ssh's ProxyCommand to this sshd (Ray's launcher always dials port 22 otherwise)."""
        return f"nc 127.0.0.1 {self.port}"


@pytest.fixture(scope="session")
def loopback_sshd(tmp_path_factory):
    """A private sshd on 127.0.0.1 (a free port) that lets the current user in with a fresh key:
    its own host key, config and authorized_keys file under a temp dir; stopped at the end.
    openssh-server, rsync and netcat come from Debian's packages (`make test` installs them)."""
    missing = [tool for tool in (SSHD, "ssh", "ssh-keygen", "rsync", "nc") if shutil.which(tool) is None]
    assert not missing, f"{missing} not installed: run `make cluster-deps` (Debian: openssh-server rsync netcat-openbsd)"
    home = tmp_path_factory.mktemp("sshd")
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / key)], check=True)
    (home / "authorized_keys").write_text((home / "user_key.pub").read_text())
    (home / "authorized_keys").chmod(0o600)
    [port] = free_ports(1)
    (home / "sshd_config").write_text("\n".join([
        f"ListenAddress 127.0.0.1:{port}", f"HostKey {home / 'host_key'}",
        f"AuthorizedKeysFile {home / 'authorized_keys'}", f"PidFile {home / 'sshd.pid'}",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
        "UsePAM no", "StrictModes no", "AcceptEnv LANG LC_*", "Subsystem sftp internal-sftp", ""]))
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege-separation directory
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", str(home / "sshd_config")], stdout=subprocess.DEVNULL,
                            stderr=open(home / "sshd.log", "w"))
    try:
        ssh = LoopbackSSH(getpass.getuser(), home / "user_key", port)
        deadline = time.monotonic() + 30
        while subprocess.run(["ssh", "-i", str(ssh.private_key), "-p", str(port), "-o", "StrictHostKeyChecking=no",
                              "-o", "UserKnownHostsFile=/dev/null", "-o", "BatchMode=yes",
                              f"{ssh.user}@127.0.0.1", "true"], capture_output=True).returncode != 0:
            assert sshd.poll() is None and time.monotonic() < deadline, (home / "sshd.log").read_text()
            time.sleep(0.5)
        yield ssh
    finally:
        sshd.terminate()
        sshd.wait(timeout=30)
