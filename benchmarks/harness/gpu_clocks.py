"""The GPU's clocks and power while a benchmark runs: a background thread reading NVML every ``interval`` seconds.

A kernel's duration depends on the clock the GPU runs it at, and a GPU kept busy without a break can lower its
clocks to stay under its power limit: the same kernels then take longer than when launched with idle gaps
between them. Each sample carries the ``label`` set when it was taken (the variant running then), so
alternating variants can be told apart: ``sampler.label = "packed"`` before a pass, ``sampler.summary()`` after.

Needs ``pynvml`` (the ``nvidia-ml-py`` package); without it, or without an NVIDIA driver, ``available`` is False,
``reason`` says why and every summary is empty.
"""
from __future__ import annotations

import statistics
import threading
from typing import Any, Dict, List, Optional, Tuple

# NVML's clock event reasons (nvmlClocksEventReason*), the bits that say why the clocks are below the maximum.
EVENT_REASONS = {
    0x1: "idle",
    0x2: "application clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock setting",
}

Sample = Tuple[Optional[str], float, float, float, float, int]  # (label, sm MHz, memory MHz, watts, deg C, reasons)


def _nvml_index(device: Any) -> int:
    """NVML's index of a torch CUDA device (CUDA_VISIBLE_DEVICES may renumber it); an int is NVML's index already
    (a process that must not start CUDA itself, such as a load generator beside a server, passes one)."""
    if isinstance(device, int):
        return device
    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    to_nvml = getattr(torch.cuda, "_get_nvml_device_index", None)
    return to_nvml(index) if to_nvml is not None else index


class GpuClockSampler:
    """``with GpuClockSampler("cuda") as sampler: sampler.label = "a"; ...`` then ``sampler.summary()``."""

    def __init__(self, device: Any = "cuda", interval: float = 0.01) -> None:
        self.interval = interval
        self.label: Optional[str] = None
        self.samples: List[Sample] = []
        self.available = False
        self.reason = ""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(_nvml_index(device))
            self._nvml = pynvml
            self._read()  # fails here, not in the thread, where a query is unsupported
            self.available = True
        except Exception as error:  # noqa: BLE001 - no NVML: the benchmark runs, without clocks
            self.reason = f"{type(error).__name__}: {error}"

    def _read(self) -> Sample:
        nvml, handle = self._nvml, self._handle
        reasons_of = (getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None)
                      or nvml.nvmlDeviceGetCurrentClocksThrottleReasons)
        return (self.label, float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
                float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
                nvml.nvmlDeviceGetPowerUsage(handle) / 1e3,
                float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)), int(reasons_of(handle)))

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.samples.append(self._read())
            except Exception:  # noqa: BLE001 - a failed read is a missing sample
                continue

    def __enter__(self) -> "GpuClockSampler":
        if self.available:
            self._thread = threading.Thread(target=self._run, daemon=True, name="gpu-clock-sampler")
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def summary(self, label: Optional[str] = None, start: int = 0) -> Dict[str, Any]:
        """Over the samples taken with ``label`` (None: all) from sample ``start`` on (``len(sampler.samples)``
        earlier marks a window): how many, the SM clock's median / min / max (MHz), the memory clock's median,
        power's median / max (W), the highest temperature and every clock event reason seen. Empty when there is
        none."""
        rows = [s for s in self.samples[start:] if label is None or s[0] == label]
        if not rows:
            return {}
        reasons = 0
        for row in rows:
            reasons |= row[5]
        sm = [row[1] for row in rows]
        power = [row[3] for row in rows]
        return {"samples": len(rows), "sm_mhz_median": statistics.median(sm), "sm_mhz_min": min(sm),
                "sm_mhz_max": max(sm), "mem_mhz_median": statistics.median(row[2] for row in rows),
                "power_w_median": statistics.median(power), "power_w_max": max(power),
                "temperature_c_max": max(row[4] for row in rows),
                "event_reasons": [name for bit, name in EVENT_REASONS.items() if reasons & bit]}


def describe(summary: Dict[str, Any]) -> str:
    """One line for a markdown table cell: SM clock and power."""
    if not summary:
        return "-"
    reasons = ", ".join(r for r in summary["event_reasons"] if r != "idle") or "none"
    return (f"SM {summary['sm_mhz_median']:.0f} MHz ({summary['sm_mhz_min']:.0f}-{summary['sm_mhz_max']:.0f}), "
            f"{summary['power_w_median']:.0f} W (max {summary['power_w_max']:.0f}); below max: {reasons}")
