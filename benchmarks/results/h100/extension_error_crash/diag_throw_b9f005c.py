import subprocess, sys

INLINE = r'''
import torch
from torch.utils.cpp_extension import load_inline
src = """
#include <torch/extension.h>
#include <string>
std::string held(int64_t n) { return c10::str("n is ", n); }
std::string released(int64_t n) { return c10::str("n is ", n); }
std::string text(int64_t n) { return c10::str("n is"); }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("held", &held);
  m.def("released", &released, py::call_guard<py::gil_scoped_release>());
  m.def("text", &text, py::call_guard<py::gil_scoped_release>());
}
"""
mod = load_inline("strdiag", cpp_sources=[src])
x = torch.zeros(4, device="cuda")
print(mod.text(3), flush=True)
print(mod.%s(3), flush=True)
'''
cases = {
    "ours, NO_GIL, packed chroma, bad slot (returns why)": r'''
from clip_flash.ops._extension import load_extension
import torch
e = load_extension()
print(repr(e.jpeg_chroma_packed(torch.zeros(64, dtype=torch.uint8, device="cuda"), torch.tensor([(62, 1, 1, 2, 2)]))))
''',
    "inline, c10::str with a number, GIL held": INLINE % "held",
    "inline, c10::str with a number, GIL released": INLINE % "released",
}
for name, code in cases.items():
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    tail = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()][-3:]
    print(f"{name}: rc {done.returncode}; " + " | ".join(line[:160] for line in tail), flush=True)
