"""A real ``python -m clip_flash.serve`` process on a free loopback port, for the server tests."""
from __future__ import annotations

import base64
import io
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import List, Optional, Sequence

import httpx

from tests.utils import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    """Starts the server with ``args``; ``wait_ready`` polls /health then /ready and records what /ready said."""

    def __init__(self, args: Sequence[str], api_key: Optional[str] = None, module: str = "clip_flash.serve") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.api_key = api_key
        self.log = tempfile.NamedTemporaryFile(prefix="clip_flash_serve_", suffix=".log", delete=False)
        command = [sys.executable, "-m", module, "--port", str(self.port), *args]
        if api_key:
            command += ["--api-key", api_key]
        self.process = subprocess.Popen(command, cwd=ROOT, stdout=self.log, stderr=subprocess.STDOUT,
                                        env=child_env())
        self.ready_statuses: List[int] = []

    @property
    def headers(self):
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def wait_ready(self, timeout: float = 120.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout
        with httpx.Client(base_url=self.url, timeout=5.0) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.output()}")
                try:
                    if client.get("/health").status_code == 200:
                        status = client.get("/ready", headers=self.headers).status_code
                        self.ready_statuses.append(status)
                        if status == 200:
                            return self
                except httpx.TransportError:
                    pass
                time.sleep(0.05)
        raise TimeoutError(f"server not ready in {timeout} s:\n{self.output()}")

    def output(self) -> str:
        with open(self.log.name, errors="replace") as handle:
            return handle.read()

    def terminate(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def stop(self, timeout: float = 30.0) -> int:
        self.terminate()
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()
        finally:
            self.log.close()
            os.unlink(self.log.name)


def jpeg_bytes(seed: int = 0, size=(320, 240)) -> bytes:
    """A JPEG of a real photo (scikit-image's samples), cropped differently per seed."""
    from PIL import Image
    from skimage import data

    photos = [data.astronaut(), data.coffee(), data.chelsea(), data.rocket()]
    photo = Image.fromarray(photos[seed % len(photos)])
    left = (seed * 37) % 40
    photo = photo.crop((left, 0, left + 300, 280)).resize(size)
    buffer = io.BytesIO()
    photo.save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def png_bytes() -> bytes:
    from PIL import Image
    from skimage import data

    buffer = io.BytesIO()
    Image.fromarray(data.camera()).save(buffer, format="PNG")  # greyscale: mode L
    return buffer.getvalue()


def data_uri(payload: bytes, kind: str = "jpeg") -> str:
    return f"data:image/{kind};base64," + base64.b64encode(payload).decode()
