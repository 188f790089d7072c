"""An engine core as a Ray actor: Ray places it (the resources it needs, on any node of the
cluster), restarts it when it dies (``max_restarts``) and names it in a namespace, so that any
gateway finds it; audio and commands keep flowing over the core protocol on ZeroMQ, between the
core and each gateway directly (shared_core.py, gateways.py). Ray is the control plane, never the
per-chunk data path.

The actor runs the core as the one-host path does (process.py in a fresh interpreter, which
inherits the actor's ``CUDA_VISIBLE_DEVICES``), so the core's GIL is not the actor's.
A core that dies after it was ready takes its actor with it (``os._exit``): Ray restarts both,
and the new incarnation reports new ports (``CoreEndpoint``). A core whose model cannot start
stays down with its reason (``wait_ready``), rather than looping through restarts.

Ray is imported inside these functions: ``voicewire.engine`` imports and runs without it.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping
from typing import Any

from voicewire.engine import EngineConfig

from .shared_core import CoreEndpoint, SharedCore

log = logging.getLogger("voicewire.engine.core")

NAMESPACE = "voicewire"  # the Ray namespace cores are named in, and gateways look in
NAME_PREFIX = "core-"  # core-0, core-1, ...
DEFAULT_MAX_RESTARTS = -1  # Ray restarts a dead core for as long as the cluster has room for it
ACTOR_THREADS = 4  # endpoint() answers while wait_ready() waits


class CoreActor:
    """The actor's body (``core_actor_class()`` is it as a Ray actor class)."""

    def __init__(self, engine: EngineConfig, name: str) -> None:
        import ray

        logging.basicConfig(level=logging.INFO)
        self._node = ray.util.get_node_ip_address()
        self._node_id = ray.get_runtime_context().get_node_id()
        self._core = SharedCore(engine, self._node, name, self._core_exited)
        self._core.start()

    def endpoint(self) -> CoreEndpoint:
        return self._core.endpoint(self._node, self._node_id)

    def wait_ready(self, timeout_s: float) -> str | None:
        """None once the core is ready; why it cannot start; TimeoutError after ``timeout_s``."""
        if not self._core.ready.wait(timeout_s):
            raise TimeoutError(f"the engine core was not ready within {timeout_s} s")
        return self._core.failure

    def shutdown(self) -> None:
        """Stop the core: its streams end with ``engine_closed`` (the actor stays until killed)."""
        self._core.stop()

    def _core_exited(self, code: int, was_ready: bool) -> None:
        if was_ready:
            # The actor's process goes with its core: Ray sees it die and restarts it (and so a
            # fresh core), as it would after a node or an OOM took both.
            os._exit(1)


def join_cluster(address: str | None, **options: Any) -> None:
    """This process joins the cluster at ``address`` (None: a new local one) as a driver.

    ``ray start --head`` turns Ray's token authentication on whenever its host has a token
    (``~/.ray/auth_token``, ``RAY_AUTH_TOKEN[_PATH]``), but ``ray.init`` sends that token only to
    a cluster it finds in /tmp/ray itself, not to an address given or set in ``RAY_ADDRESS``
    (unless ``RAY_AUTH_MODE=token``): such a head on the same host would refuse us. A driver that
    sends a token is let in by a cluster without authentication too, so we always send one we have.
    """
    import ray
    from ray._private.authentication.authentication_token_setup import (
        maybe_enable_token_auth_if_token_available,
    )

    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, **options)


@functools.cache
def core_actor_class() -> Any:
    import ray

    return ray.remote(CoreActor)


def actor_options(
    engine: EngineConfig,
    name: str,
    *,
    resources: Mapping[str, float] | None = None,
    detached: bool = False,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    gpus: float = 1.0,
) -> dict[str, Any]:
    """What Ray places a core by: one GPU (``gpus``: a share, for several cores per GPU) for a
    model on CUDA, a CPU for one on the CPU (the embedded voice), and ``resources`` (a node's
    custom resources: ``{"node2": 1}`` pins it to the node started with them)."""
    cuda = str(engine.model_options.get("device", "")).startswith("cuda")
    options: dict[str, Any] = {
        "name": name,
        "namespace": NAMESPACE,
        "num_cpus": 1,
        "num_gpus": gpus if cuda else 0,
        "max_restarts": max_restarts,
        "max_concurrency": ACTOR_THREADS,
    }
    if resources:
        options["resources"] = dict(resources)
    if detached:
        options["lifetime"] = "detached"
    return options


def core_names() -> list[str]:
    """The cores named in the namespace (alive, starting or restarting), in index order."""
    import ray

    names = [n for n in ray.util.list_named_actors(all_namespaces=False) if n.startswith(NAME_PREFIX)]
    return sorted(names, key=lambda n: (len(n), n))


def start_cores(
    engine: EngineConfig,
    replicas: int,
    *,
    resources: Mapping[str, float] | None = None,
    detached: bool = False,
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    gpus: float = 1.0,
) -> list[tuple[str, Any]]:
    """Create ``replicas`` core actors under the first free names; (name, handle) each. Returns at
    once: Ray places and starts them (``wait_ready`` says when each is warm)."""
    cls = core_actor_class()
    taken = set(core_names())
    made: list[tuple[str, Any]] = []
    index = 0
    while len(made) < replicas:
        name = f"{NAME_PREFIX}{index}"
        index += 1
        if name in taken:
            continue
        options = actor_options(
            engine, name, resources=resources, detached=detached, max_restarts=max_restarts, gpus=gpus
        )
        try:
            made.append((name, cls.options(**options).remote(engine, name)))
        except ValueError:  # another process took the name meanwhile
            continue
    return made


def stop_cores(names: list[str] | None = None, timeout_s: float = 10.0) -> list[str]:
    """Shut down and remove the named cores (all of the namespace's by default); their names."""
    import ray

    names = core_names() if names is None else names
    handles = [ray.get_actor(n, namespace=NAMESPACE) for n in names]
    # a core that does not answer in time (its node is gone, Ray is restarting it) is killed all the same
    ray.wait([h.shutdown.remote() for h in handles], num_returns=len(handles), timeout=timeout_s)
    for handle in handles:
        ray.kill(handle, no_restart=True)
    return names
