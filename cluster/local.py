"""Connect to Ray: an existing cluster (`address`) or a local one bound to 127.0.0.1.

Everything specfleet starts lives in the Ray namespace `specfleet`. A local cluster uses Ray's
token authentication, on by default for local clusters since Ray 2.59 (Ray generates the token
in ~/.ray/auth_token).
"""
from __future__ import annotations

NAMESPACE = "specfleet"


def connect(address: str | None = None, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    else:
        ray.init(
            _node_ip_address="127.0.0.1",
            namespace=NAMESPACE,
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            include_dashboard=False,
            log_to_driver=False,
        )


def shutdown() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
