"""The servers the serve bench starts: each a real process on a free loopback port, ready when /ready says so.

Configurations (``--configs``):
- ``clip_flash``: the clip_flash server, the main model (``python -m clip_flash.serve``).
- ``clip_flash-small-gpu``: the clip_flash server, the small model with ``--decode gpu``.
- ``clip_flash-2gpu``: the clip_flash server, the main model on ``--devices 0,1``.
- ``stock-inputs``: the clip_flash server with ``--no-patch --inputs stock`` (second baseline).
- ``operator``: ``baseline_server.py``, FastAPI + OpenCLIP's preprocess + the stock model, one request at a
  time (first baseline).
- ``infinity``: infinity-emb serving a random-init Hugging Face CLIP of the main model's shape (third baseline;
  skipped, and said so, where it cannot be imported).
- ``overhead``: ``overhead_server.py``, the clip_flash server with a no-op model and no image decoding: what the
  HTTP side, the batchers and their hand-offs cost a request (any machine).
- ``stub``: ``stub_server.py``, no model: the load generator's own ceiling.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class ServerConfig:
    """How to start one server and what to offer it."""

    name: str
    description: str
    command: List[str]
    workloads: Sequence[str]
    model: str  # the model spec it serves, as the results name it
    embeddings_path: str = "/v1/embeddings"
    image_path: Optional[str] = "/v1/embeddings/image"
    ready_path: str = "/ready"
    models_path: str = "/v1/models"
    json_extra: Dict[str, object] = field(default_factory=dict)  # added to every JSON body
    image_json_extra: Dict[str, object] = field(default_factory=dict)  # added to JSON bodies carrying images
    env: Dict[str, str] = field(default_factory=dict)
    wrk: bool = False  # cross-check the raw-image route with wrk
    startup_timeout_s: float = 600.0


def raise_open_files_limit() -> None:
    """Soft limit on open files up to the hard one: an overloaded point opens thousands of connections, and the
    common default soft limit (1,024) would fail them with errors that belong to neither side."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else max(soft, 65536), hard))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A started server: its process, URL and log; ``stop()`` sends SIGTERM and waits (then SIGKILL)."""

    def __init__(self, config: ServerConfig, log_path: Path) -> None:
        self.config = config
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        command = [part.replace("{port}", str(self.port)) for part in config.command]
        self.command = command
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [config.env.get("PYTHONPATH"), str(REPO_ROOT),
                                                          os.environ.get("PYTHONPATH")]))
        env.update({key: value for key, value in config.env.items() if key != "PYTHONPATH"})
        self.started = time.monotonic()
        # Own process group: stop() reaches the server's worker processes too.
        self.process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=env, start_new_session=True, preexec_fn=raise_open_files_limit)
        self.ready_after_s: Optional[float] = None

    def wait_ready(self) -> float:
        """Seconds until ``ready_path`` answered 200; raises if the process exits or the timeout passes."""
        deadline = self.started + self.config.startup_timeout_s
        url = self.base_url + self.config.ready_path
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.config.name} exited with status {self.process.returncode} before "
                                   f"it was ready; log: {self.log_path}\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        self.ready_after_s = time.monotonic() - self.started
                        return self.ready_after_s
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError(f"{self.config.name} not ready after {self.config.startup_timeout_s:.0f} s; "
                           f"log: {self.log_path}\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        self._log.flush()
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30.0) -> Optional[int]:
        """SIGTERM the server's process group, wait, SIGKILL what is left; the server's exit status."""
        if self.process.poll() is None:
            # The server alone gets SIGTERM: it answers what it accepted and stops its own workers.
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        try:  # stray children of the group (decode workers) go too
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._log.close()
        return self.process.returncode


def clip_flash_command(model: str, precision: str, device: str, extra: Sequence[str]) -> List[str]:
    command = [sys.executable, "-m", "clip_flash.serve", "--model", model, "--precision", precision,
               "--host", "127.0.0.1", "--port", "{port}"]
    if device != "cuda":
        command += ["--device", device]
    return command + list(extra)


def infinity_available(site: Optional[Path]) -> Optional[str]:
    """None when ``infinity_emb`` imports (with ``site`` on the path), else the reason it does not."""
    env = dict(os.environ)
    if site:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", "import infinity_emb.cli, transformers"], env=env,
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return None
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return f"infinity_emb cannot be imported: {last}"


def build_configs(names: Sequence[str], model: str, small_model: str, precision: str, device: str,
                  server_args: Sequence[str], stub_workers: int, infinity_model_dir: Optional[Path],
                  infinity_site: Optional[Path], infinity_batch: int) -> List[ServerConfig]:
    """The configurations named, in the order named."""
    python = sys.executable
    all_workloads = ("image-raw", "image-uri", "caption", "captions64", "mix")
    configs = {
        "clip_flash": lambda: ServerConfig(
            "clip_flash", f"clip_flash server, {model} {precision}",
            clip_flash_command(model, precision, device, server_args), all_workloads, model, wrk=True),
        "clip_flash-small-gpu": lambda: ServerConfig(
            "clip_flash-small-gpu", f"clip_flash server, {small_model} {precision}, --decode gpu",
            clip_flash_command(small_model, precision, device, ["--decode", "gpu", *server_args]),
            ("image-raw",), small_model, wrk=True),
        "clip_flash-2gpu": lambda: ServerConfig(
            "clip_flash-2gpu", f"clip_flash server, {model} {precision}, --devices 0,1",
            clip_flash_command(model, precision, device, ["--devices", "0,1", *server_args]),
            ("image-raw", "caption", "captions64"), model, wrk=True),
        "stock-inputs": lambda: ServerConfig(
            "stock-inputs", f"clip_flash server --no-patch --inputs stock, {model} {precision}",
            clip_flash_command(model, precision, device, ["--no-patch", "--inputs", "stock", *server_args]),
            ("image-raw", "caption", "captions64"), model),
        "operator": lambda: ServerConfig(
            "operator", f"FastAPI + OpenCLIP preprocess + stock model, one request at a time, {model} {precision}",
            [python, str(REPO_ROOT / "benchmarks/serve/baseline_server.py"), "--model", model, "--precision",
             precision, "--device", device, "--port", "{port}"],
            ("image-raw", "caption"), model),
        "infinity": lambda: ServerConfig(
            "infinity", f"infinity-emb (torch engine), random-init Hugging Face CLIP shaped as {model}, "
                        f"{precision}, batch {infinity_batch}",
            [python, "-m", "infinity_emb.cli", "v2", "--model-id", str(infinity_model_dir), "--served-model-name",
             "clip", "--engine", "torch", "--device", device, "--dtype", _infinity_dtype(precision),
             "--batch-size", str(infinity_batch), "--no-model-warmup", "--log-level", "warning",
             "--host", "127.0.0.1", "--port", "{port}"],
            ("image-uri", "caption"), model, embeddings_path="/embeddings", image_path=None,
            ready_path="/health", models_path="/models", image_json_extra={"modality": "image"},
            env={"DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0",
                 **({"PYTHONPATH": str(infinity_site)} if infinity_site else {})}),
        "overhead": lambda: ServerConfig(
            "overhead", "clip_flash server with a no-op model and no image decoding (overhead_server.py): what the "
                        "HTTP side, the batchers and their hand-offs cost",
            [python, "-m", "benchmarks.serve.overhead_server", "--model", model, "--host", "127.0.0.1", "--port",
             "{port}", *server_args],
            ("image-raw", "caption", "captions64"), model),
        "stub": lambda: ServerConfig(
            "stub", f"model-less Starlette stub, {stub_workers} uvicorn process(es): the generator's ceiling",
            [python, "-m", "benchmarks.serve.stub_server", "--port", "{port}", "--workers", str(stub_workers)],
            ("image-raw", "caption"), "stub", wrk=True),
    }
    unknown = [name for name in names if name not in configs]
    if unknown:
        raise ValueError(f"unknown configuration(s) {unknown}; known: {sorted(configs)}")
    return [configs[name]() for name in names]


def _infinity_dtype(precision: str) -> str:
    return {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}[precision]
