"""Exploration: how far cuBLASLt's first heuristic pick is from the fastest algorithm it offers, at the text
tower's four projections (x @ W.T + b, fp16, fp32 accumulate), against torch's F.linear."""
import sys, json, os
import torch, torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

src = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>
#include <vector>
#include <algorithm>
#define CK(x) do { auto s = (x); TORCH_CHECK(s == CUBLAS_STATUS_SUCCESS, #x, " -> ", int(s)); } while (0)
// Times every algorithm cuBLASLt's heuristic returns for y = x W^T (+ b); returns [(rank, median ms, tile, stages, splitk, swizzle, cta, ok)].
std::vector<std::vector<double>> sweep(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor y,
                                       torch::Tensor workspace, int64_t requested, int64_t repeats, bool bias) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  cublasLtHandle_t handle; CK(cublasLtCreate(&handle));
  cublasLtMatmulDesc_t op; CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  if (bias) {
    cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
    const void* bp = b.data_ptr();
    CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  }
  cublasLtMatrixLayout_t la, lb, lc;
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, N, M, N));
  cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
  size_t ws = workspace.numel();
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(requested);
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, pref, requested, results.data(), &found));
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  float alpha = 1.0f, beta = 0.0f;
  std::vector<std::vector<double>> out;
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  for (int i = 0; i < found; ++i) {
    auto run = [&]() {
      return cublasLtMatmul(handle, op, &alpha, w.data_ptr(), la, x.data_ptr(), lb, &beta, y.data_ptr(), lc,
                            y.data_ptr(), lc, &results[i].algo, workspace.data_ptr(), ws, stream);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) { out.push_back({double(i), -1}); continue; }
    for (int r = 0; r < 3; ++r) run();
    std::vector<float> t;
    for (int r = 0; r < repeats; ++r) {
      cudaEventRecord(e0, stream); run(); cudaEventRecord(e1, stream); cudaEventSynchronize(e1);
      float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    int tile = 0, stages = 0, splitk = 0, swizzle = 0, id = 0; uint16_t cta = 0; size_t written;
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&results[i].algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cta, sizeof(cta), &written);
    out.push_back({double(i), t[t.size() / 2], double(id), double(tile), double(stages), double(splitk), double(swizzle), double(cta), double(results[i].workspaceSize)});
  }
  cudaEventDestroy(e0); cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc); cublasLtMatmulDescDestroy(op); cublasLtDestroy(handle);
  return out;
}
'''
cpp = "std::vector<std::vector<double>> sweep(torch::Tensor x, torch::Tensor w, torch::Tensor b, torch::Tensor y, torch::Tensor workspace, int64_t requested, int64_t repeats, bool bias);"
import glob
from torch.utils.cpp_extension import CUDA_HOME
# torch's own cuBLASLt first (its heuristics are the ones F.linear gets), then the toolkit's.
candidates = (sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcublasLt.so*")))
              + sorted(glob.glob(f"{CUDA_HOME}/lib64/libcublasLt.so*") + glob.glob(f"{CUDA_HOME}/targets/*/lib/libcublasLt.so*")))
print("cublasLt candidates:", candidates)
lib = candidates[0]
includes = [os.path.join(os.path.dirname(lib), "..", "include")]
mod = load_inline("lt_algos", cpp_sources=cpp, cuda_sources=src, functions=["sweep"],
                  extra_ldflags=[f"-L{os.path.dirname(lib)}", f"-l:{os.path.basename(lib)}", f"-Wl,-rpath,{os.path.dirname(lib)}"],
                  extra_include_paths=includes, extra_cuda_cflags=["-O3", "-std=c++17"], verbose=False)
width, mlp = 768, 3072
shapes = {"qkv": (3 * width, width), "out": (width, width), "c_fc": (mlp, width), "c_proj": (width, mlp)}
workspace = torch.empty(32 << 20, dtype=torch.uint8, device="cuda")
report = {}
for tokens in [int(t) for t in sys.argv[2:]] or [25600]:
    for name, (n, k) in shapes.items():
        x = torch.randn(tokens, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5
        b = torch.randn(n, device="cuda", dtype=torch.float16)
        y = torch.empty(tokens, n, device="cuda", dtype=torch.float16)
        for _ in range(5): F.linear(x, w, b)
        e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
        t = []
        for _ in range(50):
            e0.record(); F.linear(x, w, b); e1.record(); e1.synchronize(); t.append(e0.elapsed_time(e1))
        torch_ms = sorted(t)[25]
        rows = mod.sweep(x, w, b, y, workspace, 32, 50, True)
        ok = [r for r in rows if r[1] > 0]
        best = min(ok, key=lambda r: r[1])
        flop = 2 * tokens * n * k
        print(f"{tokens} {name:6s} torch {torch_ms:.4f} ms ({flop/torch_ms/1e9:.0f} TF/s); heuristic #0 {ok[0][1]:.4f}; "
              f"best #{int(best[0])} {best[1]:.4f} ms ({flop/best[1]/1e9:.0f} TF/s) of {len(ok)}: id {int(best[2])} tile {int(best[3])} "
              f"stages {int(best[4])} splitk {int(best[5])} swizzle {int(best[6])} cluster {int(best[7])} ws {int(best[8])}", flush=True)
        report[f"{tokens}_{name}"] = {"torch_ms": torch_ms, "algos": rows}
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "report": report}, open(sys.argv[1], "w"))
