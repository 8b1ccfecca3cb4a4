"""Exploration: the host cost of the launch thread's first steps for a lone request (the stream context, the host
gate's wait and its parts), each call after 20 ms asleep (as at 50 req/s) and back to back, medians in us."""
import json, statistics, sys, time
import torch
from clip_flash.ops.host_gate import HostGate
from clip_flash.ops._extension import load_extension

ext = load_extension()
dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
gate = HostGate.create(dev)
stream = torch.cuda.Stream(dev)
counter = gate._counter
x = torch.zeros(1, device=dev)

def stream_ctx():
    with torch.cuda.stream(stream):
        pass

def stream_set():
    prev = torch.cuda.current_stream()
    torch.cuda.set_stream(stream)
    torch.cuda.set_stream(prev)

def stream_raw():
    torch._C._cuda_setStream(stream_id=stream.stream_id, device_index=stream.device_index, device_type=stream.device_type)
    torch._C._cuda_setStream(stream_id=0, device_index=0, device_type=1)

def is_pinned():
    counter.is_pinned()

ticket = [0]
def gate_wait():
    ticket[0] = gate.next_ticket(); gate.open(ticket[0]); gate.wait(ticket[0])

def gate_open():
    gate.open(ticket[0])

def add_one():
    x.add_(1)

def current_device():
    torch.cuda.current_device()

cases = {"stream_ctx": stream_ctx, "stream_set": stream_set, "stream_raw": stream_raw, "is_pinned": is_pinned,
         "gate_wait(+open)": gate_wait, "gate_open": gate_open, "tensor_add_launch": add_one, "current_device": current_device}
for fn in cases.values():
    for _ in range(50): fn()
torch.cuda.synchronize()
out = {}
for mode in ("asleep_20ms", "back_to_back"):
    times = {name: [] for name in cases}
    for i in range(150):
        for name, fn in cases.items():
            if mode == "asleep_20ms":
                time.sleep(0.02)
            t0 = time.perf_counter_ns(); fn(); t1 = time.perf_counter_ns()
            times[name].append((t1 - t0) / 1e3)
        torch.cuda.synchronize()
    out[mode] = {name: statistics.median(v) for name, v in times.items()}
    print(mode, {k: round(v, 1) for k, v in out[mode].items()}, flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "medians_us": out}, open(sys.argv[1], "w"), indent=1)
