"""The command line across hosts: engine cores placed by Ray, gateways that front them.

    voicewire engine --ray auto --replicas 2 [--resources '{"gpu_node": 1}'] [model flags]
    voicewire gateway --ray auto --port 8080 --workers 4
    voicewire serve --ray [ADDRESS]          # both in one process tree (no ADDRESS: a local cluster)
    voicewire engine --ray auto --stop

``engine`` starts detached, named core actors (engine/core/ray_actor.py) and returns once they are
warm: they outlive it, and Ray restarts them. ``gateway`` finds every core of the namespace and
serves in front of them; it owns no engine, so gateways start, stop and restart freely.
``--workers N`` runs N gateway processes on one port (SO_REUSEPORT: the kernel spreads new
connections over them; a session is one connection, so it stays on its process).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from voicewire.engine import EngineConfig
from voicewire.engine.core.ray_group import OwnCores, RayCores

from .engine_flags import UsageError, add_model_args, to_engine_config, unmet_requirements
from .gateway_procs import GatewayProcesses

READY_TIMEOUT_S = 600.0  # `engine` waits this long for its cores (a Qwen3 core captures CUDA graphs)


def _resources(value: str) -> dict[str, float]:
    try:
        parsed = json.loads(value)
        if not isinstance(parsed, dict) or not all(isinstance(v, int | float) for v in parsed.values()):
            raise ValueError
    except ValueError:
        raise argparse.ArgumentTypeError(f'expected a JSON object of numbers, like \'{{"node2": 1}}\', got {value!r}') from None
    return {str(k): float(v) for k, v in parsed.items()}


def _add_ray_address(p: argparse.ArgumentParser, **kwargs: Any) -> None:
    p.add_argument(
        "--ray",
        metavar="ADDRESS",
        help="the Ray cluster: auto (the one `ray start` made on this host, or RAY_ADDRESS), or HOST:PORT",
        **kwargs,
    )


def _add_placement(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--resources",
        type=_resources,
        default={},
        metavar="JSON",
        help="custom Ray resources each core needs, e.g. '{\"gpu_node\": 1}' for nodes started with "
        "`ray start --resources '{\"gpu_node\": 8}'` (cores also take 1 CPU, and 1 GPU on cuda)",
    )


def add_ray_serve_args(serve: argparse.ArgumentParser) -> None:
    _add_ray_address(serve, nargs="?", const="local", default=None)
    serve.set_defaults(resources={})
    group = serve.add_argument_group("engine cores as Ray actors (docs/across-hosts.md)")
    _add_placement(group)  # type: ignore[arg-type]


def add_ray_commands(
    sub: Any, formatter: type[argparse.HelpFormatter], add_gateway_args: Callable[[argparse.ArgumentParser], None]
) -> None:
    engine = sub.add_parser(
        "engine", help="start engine cores as Ray actors (they outlive this command)", formatter_class=formatter
    )
    _add_ray_address(engine, default="auto")
    engine.add_argument("--replicas", type=int, default=1, help="engine cores to start")
    _add_placement(engine)
    engine.add_argument(
        "--gpus-per-core", type=float, default=1.0, help="on cuda: the GPU share each core takes (0.5: two a GPU)"
    )
    engine.add_argument(
        "--max-restarts", type=int, default=-1, help="times Ray restarts a core that dies (-1: always)"
    )
    engine.add_argument("--stop", action="store_true", help="shut down every core of the cluster instead")
    add_model_args(engine)
    gateway = sub.add_parser(
        "gateway", help="run a gateway in front of the engine cores Ray has", formatter_class=formatter
    )
    add_gateway_args(gateway)
    _add_ray_address(gateway, default="auto")
    gateway.add_argument(
        "--workers", type=int, default=1, help="gateway processes on this port (SO_REUSEPORT)"
    )


def ray_cores(args: argparse.Namespace, engine: EngineConfig) -> RayCores:
    """``serve --ray``: cores this process starts and stops."""
    if args.devices:
        raise UsageError("--devices does not apply with --ray: Ray gives each core its GPU")
    replicas = args.replicas or 1
    address = None if args.ray == "local" else args.ray
    return RayCores(address, OwnCores(engine, replicas, args.resources))


def run_ray_command(args: argparse.Namespace, argv: list[str], serve: Callable[..., int]) -> int:
    """``engine`` or ``gateway``; ``serve`` runs one gateway (``cli._serve``)."""
    if args.command == "engine":
        return _engine(args)
    if args.workers > 1:
        return _workers(args.workers, argv)
    return serve(args, EngineConfig(), RayCores(args.ray), reuse_port=args.reuse_port)


def _engine(args: argparse.Namespace) -> int:
    import ray

    from voicewire.engine.core.ray_actor import join_cluster, start_cores, stop_cores

    logging.basicConfig(level=logging.WARNING)
    if not args.stop:
        try:
            engine = to_engine_config(args)
        except UsageError as err:
            print(f"voicewire engine: {err}", file=sys.stderr)
            return 2
        unmet = unmet_requirements(args)
        if unmet is not None:
            print(f"voicewire engine: {unmet}", file=sys.stderr)
            return 1
        if args.replicas < 1:
            print("voicewire engine: --replicas must be 1 or more", file=sys.stderr)
            return 2
    try:
        join_cluster(args.ray)
    except Exception as err:
        print(f"voicewire engine: cannot join the Ray cluster at {args.ray}: {err}", file=sys.stderr)
        return 1
    if args.stop:
        names = stop_cores()
        print(f"voicewire engine: stopped {len(names)} cores{': ' + ', '.join(names) if names else ''}", flush=True)
        return 0
    made = start_cores(
        engine,
        args.replicas,
        resources=args.resources,
        detached=True,
        max_restarts=args.max_restarts,
        gpus=args.gpus_per_core,
    )
    failed = 0
    for name, handle in made:
        try:
            failure = ray.get(handle.wait_ready.remote(READY_TIMEOUT_S), timeout=READY_TIMEOUT_S + 5)
        except Exception as err:
            failure = f"{type(err).__name__}: {err}"
        if failure is not None:
            failed += 1
            print(f"voicewire engine: {name} failed to start: {failure}", file=sys.stderr)
            ray.kill(handle, no_restart=True)
            continue
        ep = ray.get(handle.endpoint.remote())
        print(f"voicewire engine: {name} ready on {ep.node} ({engine.model}, pid {ep.pid})", flush=True)
    return 1 if failed else 0


def _workers(n: int, argv: list[str]) -> int:
    """N gateway processes on one port (gateway_procs.py)."""
    argv = [sys.executable, "-m", "voicewire.realtime.cli", *_without_workers(argv)]
    return GatewayProcesses(n, argv, "voicewire gateway").run()


def _without_workers(argv: list[str]) -> list[str]:
    out: list[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == "--workers":
            skip = True
        elif not token.startswith("--workers="):
            out.append(token)
    return out
