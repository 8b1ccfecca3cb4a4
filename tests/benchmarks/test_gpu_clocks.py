"""The benchmarks' GPU clock sampler: samples carry the label set when taken, and without NVML it stands aside."""
import sys
import time
import types

from benchmarks.harness import gpu_clocks


def fake_nvml(clock_of_call):
    calls = {"n": 0}

    def clock(handle, which):
        calls["n"] += 1
        return clock_of_call(calls["n"]) if which == 0 else 2619

    return types.SimpleNamespace(
        NVML_CLOCK_SM=0, NVML_CLOCK_MEM=1, NVML_TEMPERATURE_GPU=0,
        nvmlInit=lambda: None, nvmlDeviceGetHandleByIndex=lambda index: ("gpu", index),
        nvmlDeviceGetClockInfo=clock, nvmlDeviceGetPowerUsage=lambda handle: 650_000,
        nvmlDeviceGetTemperature=lambda handle, sensor: 61,
        nvmlDeviceGetCurrentClocksEventReasons=lambda handle: 0x4)


def test_samples_are_summarised_by_label(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(lambda n: 1980 if n < 40 else 1755))
    monkeypatch.setattr(gpu_clocks, "_nvml_index", lambda device: 0)
    sampler = gpu_clocks.GpuClockSampler("cuda:0", interval=0.001)
    assert sampler.available, sampler.reason
    with sampler:
        sampler.label = "a"
        while len(sampler.samples) < 10:
            time.sleep(0.001)
        sampler.label = "b"
        while sum(s[0] == "b" for s in sampler.samples) < 10:
            time.sleep(0.001)
    a, b = sampler.summary("a"), sampler.summary("b")
    assert a["samples"] >= 10 and b["samples"] >= 10
    assert a["sm_mhz_max"] == 1980 and b["sm_mhz_min"] == 1755  # the clock fell while "b" ran
    assert a["power_w_median"] == 650.0 and a["mem_mhz_median"] == 2619 and a["temperature_c_max"] == 61
    assert a["event_reasons"] == ["software power cap"]
    assert sampler.summary("never") == {}
    assert "650 W" in gpu_clocks.describe(a) and "software power cap" in gpu_clocks.describe(a)


def test_without_nvml_it_stands_aside(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    sampler = gpu_clocks.GpuClockSampler("cuda:0")
    assert not sampler.available and "pynvml" in sampler.reason
    with sampler:
        pass
    assert sampler.summary() == {} and gpu_clocks.describe({}) == "-"
