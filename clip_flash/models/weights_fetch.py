"""Before OpenCLIP fetches a pretrained tag's weights: say so, use the local cache, honour ``HF_HUB_OFFLINE``,
and fail in seconds when the source cannot be reached.

Left to itself, the hub client retries an unreachable host for most of a minute before OpenCLIP raises, and
says nothing meanwhile. Here the source (the Hugging Face hub or a plain URL, chosen as OpenCLIP chooses it)
is worked out first, the local cache is looked at, and only when the weights are not cached is the host
probed with one short TCP connection (through the configured HTTPS proxy when there is one).
"""
from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Iterator, Optional, Tuple

from .. import envs

logger = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 4.0  # one TCP connect (DNS included); a reachable host answers in well under a second
OFFLINE_SWITCH = envs.HF_HUB_OFFLINE.name


class WeightsUnreachableError(Exception):
    """The weights are not cached and their source cannot be reached (or offline mode forbids it)."""


@dataclass(frozen=True)
class WeightsSource:
    """Where OpenCLIP will read a tag's weights from."""

    kind: str  # "hub", "url" or "file"
    location: str  # hub repo id, URL, or local path
    host: Optional[str]  # host to reach (None for a local file)
    cached_path: Optional[str]  # the file in the local cache, when it is there

    @property
    def description(self) -> str:
        if self.kind == "hub":
            return f"the Hugging Face hub ({self.location})"
        return self.location


def hub_offline() -> bool:
    """Whether the hub client is in offline mode (``HF_HUB_OFFLINE=1``, read when it was imported)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        return os.environ.get(OFFLINE_SWITCH, "").strip().upper() in ("1", "ON", "YES", "TRUE")
    return bool(constants.is_offline_mode())


def _hub_host() -> str:
    from huggingface_hub import constants

    return urllib.parse.urlparse(constants.ENDPOINT).hostname or "huggingface.co"


def _hub_file_candidates(filename: Optional[str]) -> Tuple[str, ...]:
    """The files OpenCLIP asks the hub for, in its order: a .safetensors twin first, then the file itself."""
    from open_clip.constants import HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

    filename = filename or HF_WEIGHTS_NAME
    if filename == HF_WEIGHTS_NAME:
        return (HF_SAFE_WEIGHTS_NAME, filename)
    if filename.endswith((".bin", ".pth")):
        return (filename[:-4] + ".safetensors", filename)
    return (filename,)


def _cached_hub_file(repo_id: str, filename: Optional[str]) -> Optional[str]:
    from huggingface_hub import try_to_load_from_cache

    for candidate in _hub_file_candidates(filename):
        path = try_to_load_from_cache(repo_id=repo_id, filename=candidate)
        if isinstance(path, str) and os.path.isfile(path):
            return path
    return None


HF_HUB_PREFIX = "hf-hub:"


def weights_source(name: str, tag: Optional[str]) -> Optional[WeightsSource]:
    """Where OpenCLIP would read ``name``'s weights for ``tag`` (None when it has no such tag). An
    ``hf-hub:ORG/REPO`` name brings its config and weights from that hub repository."""
    import open_clip
    from open_clip.pretrained import has_hf_hub

    if name.startswith(HF_HUB_PREFIX) and tag is None:
        from open_clip.constants import HF_CONFIG_NAME

        repo_id = name[len(HF_HUB_PREFIX):]
        return WeightsSource("hub", repo_id, _hub_host(), _cached_hub_file(repo_id, HF_CONFIG_NAME))
    cfg = open_clip.get_pretrained_cfg(name, tag)
    if not cfg:
        return None
    if cfg.get("file"):
        return WeightsSource("file", cfg["file"], None, cfg["file"] if os.path.isfile(cfg["file"]) else None)
    hub_path = cfg.get("hf_hub", "")
    if hub_path and has_hf_hub():
        repo_id, filename = os.path.split(hub_path)
        return WeightsSource("hub", repo_id, _hub_host(), _cached_hub_file(repo_id, filename or None))
    url = cfg.get("url", "")
    if not url:
        return None
    cached = os.path.join(os.path.expanduser("~/.cache/clip"), os.path.basename(url))
    return WeightsSource("url", url, urllib.parse.urlparse(url).hostname, cached if os.path.isfile(cached) else None)


def _proxy_for(host: str) -> Optional[Tuple[str, int]]:
    """(host, port) of the HTTPS proxy the download would go through, or None for a direct connection."""
    proxy = urllib.request.getproxies().get("https")
    if not proxy or urllib.request.proxy_bypass(host):
        return None
    parsed = urllib.parse.urlparse(proxy if "://" in proxy else f"http://{proxy}")
    return (parsed.hostname, parsed.port or 8080) if parsed.hostname else None


def probe_host(host: str, port: int = 443, timeout: float = PROBE_TIMEOUT_S) -> Optional[str]:
    """Why ``host`` cannot be reached (one TCP connection, proxy-aware, at most ``timeout`` s), or None."""
    target = _proxy_for(host) or (host, port)
    outcome: list = []

    def connect() -> None:
        try:
            socket.create_connection(target, timeout=timeout).close()
            outcome.append(None)
        except OSError as error:
            outcome.append(f"{type(error).__name__}: {error}")

    # DNS resolution has no timeout of its own: bound the whole attempt from outside.
    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(timeout + 1.0)
    if not outcome:
        return f"no answer within {timeout:.0f} s"
    reason = outcome[0]
    if reason is not None and target[0] != host:
        reason = f"proxy {target[0]}:{target[1]}: {reason}"
    return reason


@contextlib.contextmanager
def _hub_offline_for_this_load() -> Iterator[None]:
    """Offline mode for the duration of one load: the hub client then reads its cache without asking the
    network (which would otherwise be retried for most of a minute before the cache is used)."""
    try:
        from huggingface_hub import constants
    except ImportError:
        yield
        return
    previous = constants.HF_HUB_OFFLINE
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = previous


@contextlib.contextmanager
def prepared_fetch(name: str, tag: Optional[str]) -> Iterator[Optional[WeightsSource]]:
    """Announce the fetch, then let the load inside the with-block run; raise ``WeightsUnreachableError``
    at once (before any download is attempted) when the weights are not cached and cannot be fetched."""
    source = weights_source(name, tag)
    if source is None or source.kind == "file":
        yield source
        return
    if source.cached_path is not None:
        logger.info("loading pretrained weights for %s from the local cache (%s)",
                    f"{name} tag {tag}" if tag else name, source.cached_path)
        reachable = hub_offline() or source.host is None or probe_host(source.host) is None
        with contextlib.nullcontext() if reachable or source.kind != "hub" else _hub_offline_for_this_load():
            yield source
        return
    if source.kind == "hub" and hub_offline():
        raise WeightsUnreachableError(
            f"{OFFLINE_SWITCH} is set and the weights (hub repo {source.location}) are not in the local "
            f"cache; unset {OFFLINE_SWITCH} to fetch them"
        )
    what = f"{name} tag {tag}" if tag else name
    logger.info("fetching pretrained weights for %s from %s; later runs read them from the local cache",
                what, source.description)
    reason = probe_host(source.host) if source.host else None
    if reason is not None:
        raise WeightsUnreachableError(f"cannot reach {source.host} ({reason}): no network?")
    yield source
