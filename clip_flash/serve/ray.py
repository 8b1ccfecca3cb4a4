"""``clip-flash serve`` beyond one machine: a Ray Serve deployment, one replica per GPU, each running the same
engine and the same routes as the command (``build_app``), behind Ray's HTTP proxy.

    import ray
    from ray import serve
    from clip_flash.serve import ServeConfig
    from clip_flash.serve.ray import deployment

    ray.init()
    serve.start(http_options={"host": "0.0.0.0", "port": 8000})
    serve.run(deployment(ServeConfig(model="ViT-L-14::laion2b_s32b_b82k")), route_prefix="/")

Each replica loads its model before Ray routes to it (the replica's constructor returns once the model is loaded
and its graphs captured), batches across the requests Ray routes to it, and stops answering what it accepted
when Ray stops it. Needs ``pip install "ray[serve]"``. Ray's proxy adds its own cost per request (1-2 ms by
Ray's own account): on one machine, ``clip-flash serve --devices 0,1`` is the faster path.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from .config import ServeConfig


class ReplicaApp:
    """The builder Ray calls on each replica: load the engine on this replica's device, return the routes."""

    def __init__(self, config: ServeConfig) -> None:
        self.config = config

    def __call__(self) -> Any:
        import torch

        from .app import build_app
        from .engine import FAILED, EnginePool

        # Ray gives each replica its GPU(s) through CUDA_VISIBLE_DEVICES: the first visible device is ours.
        device = self.config.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
        config = dataclasses.replace(self.config, device=device, devices=(), workers=1)
        pool = EnginePool(config)
        pool.load()
        if pool.state == FAILED:
            raise RuntimeError(f"clip_flash serve replica could not load its model: {pool.error}")
        return build_app(config, pool, load=False)


def deployment(config: Optional[ServeConfig] = None, *, num_replicas: Optional[int] = None,
               num_gpus: Optional[float] = None, max_ongoing_requests: Optional[int] = None,
               name: str = "clip_flash", **options: Any):
    """A bound Ray Serve application for ``serve.run``.

    Args:
        config: the server's settings (``device``/``devices``/``workers`` are per replica: one device each).
        num_replicas: default: one per GPU in the cluster (at least one).
        num_gpus: GPUs per replica; default 1 where the cluster has GPUs, else 0 (CPU replicas).
        max_ongoing_requests: requests Ray lets into one replica at once; default ``config.max_queue``, so that
            the replica's own batcher (not Ray's small default of 5) decides how many wait, and sheds with 429.
        options: more ``serve.deployment`` options.
    """
    import ray
    from ray import serve

    config = config or ServeConfig()
    if not ray.is_initialized():
        ray.init()
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if num_gpus is None:
        num_gpus = 1 if gpus else 0
    if num_replicas is None:
        num_replicas = max(1, gpus // max(1, int(num_gpus))) if num_gpus else 1
    actor_options: Dict[str, Any] = {"num_gpus": num_gpus}
    actor_options.update(options.pop("ray_actor_options", {}))
    builder = ReplicaApp(config)

    def build_replica_app() -> Any:  # Ray takes a builder only as a plain function
        return builder()

    replica = serve.deployment(
        serve.ingress(build_replica_app)(),
        name=name, num_replicas=num_replicas, ray_actor_options=actor_options,
        max_ongoing_requests=max_ongoing_requests or config.max_queue, **options)
    return replica.bind()
