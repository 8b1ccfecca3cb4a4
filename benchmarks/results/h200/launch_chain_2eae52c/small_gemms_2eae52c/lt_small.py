"""Exploration: small-row GEMMs (a lone image or caption) as they run in a tower's CUDA graph: weights streamed
from HBM (one copy a layer), each algorithm cuBLASLt's heuristic offers (and split-K variants of them) against
torch's F.linear, all captured in graphs, replay medians."""
import sys, json, os, glob, time
import torch, torch.nn.functional as F
from torch.utils.cpp_extension import load_inline, CUDA_HOME

src = r'''
#include <torch/extension.h>
#include <c10/cuda/CUDAStream.h>
#include <cublasLt.h>
#include <vector>
#define CK(x) do { auto s = (x); TORCH_CHECK(s == CUBLAS_STATUS_SUCCESS, #x, " -> ", int(s)); } while (0)
static cublasLtHandle_t handle = nullptr;
static cublasLtMatmulDesc_t op = nullptr;
static cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
static std::vector<cublasLtMatmulAlgo_t> algos;
static std::vector<std::vector<int64_t>> described;
static size_t ws_bytes = 0;
static void describe(const cublasLtMatmulAlgo_t& a, int64_t source) {
  int tile = 0, stages = 0, splitk = 0, swizzle = 0, id = 0, red = 0; uint16_t cta = 0; size_t w;
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages, sizeof(stages), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof(splitk), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle), &w);
  cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cta, sizeof(cta), &w);
  described.push_back({source, id, tile, stages, splitk, red, swizzle, cta});
}
// Sets up y[M,N] = x[M,K] w[N,K]^T + b for fp16 and returns the candidate algorithms' descriptions.
std::vector<std::vector<int64_t>> prepare(int64_t M, int64_t N, int64_t K, torch::Tensor b, int64_t requested, int64_t ws) {
  if (!handle) CK(cublasLtCreate(&handle));
  if (op) { cublasLtMatmulDescDestroy(op); cublasLtMatrixLayoutDestroy(la); cublasLtMatrixLayoutDestroy(lb); cublasLtMatrixLayoutDestroy(lc); }
  CK(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  cublasLtEpilogue_t ep = CUBLASLT_EPILOGUE_BIAS;
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &ep, sizeof(ep)));
  const void* bp = b.data_ptr();
  CK(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
  CK(cublasLtMatrixLayoutCreate(&la, CUDA_R_16F, K, N, K));
  CK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16F, K, M, K));
  CK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_16F, N, M, N));
  cublasLtMatmulPreference_t pref; CK(cublasLtMatmulPreferenceCreate(&pref));
  ws_bytes = ws;
  CK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes, sizeof(ws_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> results(requested);
  int found = 0;
  CK(cublasLtMatmulAlgoGetHeuristic(handle, op, la, lb, lc, lc, pref, requested, results.data(), &found));
  cublasLtMatmulPreferenceDestroy(pref);
  algos.clear(); described.clear();
  for (int i = 0; i < found; ++i) { algos.push_back(results[i].algo); describe(results[i].algo, 0); }
  // split-K variants of each heuristic pick (fp32 reduction in the workspace, or in the output for 1)
  int splits[] = {2, 3, 4, 6, 8, 12, 16};
  for (int i = 0; i < found; ++i) {
    for (int s : splits) {
      cublasLtMatmulAlgo_t a = results[i].algo;
      int one = 1; size_t w;
      int cur = 0; cublasLtMatmulAlgoConfigGetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &cur, sizeof(cur), &w);
      if (cur == s) continue;
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s, sizeof(s)) != CUBLAS_STATUS_SUCCESS) continue;
      uint32_t red = CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &red, sizeof(red)) != CUBLAS_STATUS_SUCCESS) continue;
      cublasLtMatmulHeuristicResult_t check;
      if (cublasLtMatmulAlgoCheck(handle, op, la, lb, lc, lc, &a, &check) != CUBLAS_STATUS_SUCCESS) continue;
      if (check.workspaceSize > ws_bytes) continue;
      (void)one;
      algos.push_back(a); describe(a, 1 + i);
    }
  }
  return described;
}
void run(torch::Tensor x, torch::Tensor w, torch::Tensor y, torch::Tensor workspace, int64_t i) {
  float alpha = 1.0f, beta = 0.0f;
  auto stream = c10::cuda::getCurrentCUDAStream().stream();
  CK(cublasLtMatmul(handle, op, &alpha, w.data_ptr(), la, x.data_ptr(), lb, &beta, y.data_ptr(), lc,
                    y.data_ptr(), lc, &algos[i], workspace.data_ptr(), ws_bytes, stream));
}
'''
cpp = ("std::vector<std::vector<int64_t>> prepare(int64_t M, int64_t N, int64_t K, torch::Tensor b, int64_t requested, int64_t ws);"
       "void run(torch::Tensor x, torch::Tensor w, torch::Tensor y, torch::Tensor workspace, int64_t i);")
candidates = (sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "..", "nvidia", "*", "lib", "libcublasLt.so*")))
              + sorted(glob.glob(f"{CUDA_HOME}/lib64/libcublasLt.so*")))
print("cublasLt candidates:", candidates, flush=True)
lib = candidates[0]
t0 = time.time()
mod = load_inline("lt_small", cpp_sources=cpp, cuda_sources=src, functions=["prepare", "run"],
                  extra_ldflags=[f"-L{os.path.dirname(lib)}", f"-l:{os.path.basename(lib)}", f"-Wl,-rpath,{os.path.dirname(lib)}"],
                  extra_include_paths=[os.path.join(os.path.dirname(lib), "..", "include")],
                  extra_cuda_cflags=["-O3", "-std=c++17"], verbose=False)
print(f"built in {time.time()-t0:.1f} s", flush=True)
WS = 32 << 20
workspace = torch.empty(WS, dtype=torch.uint8, device="cuda")

def graph_ms(fn, replays=30):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    t = []
    for _ in range(replays):
        e0.record(); g.replay(); e1.record(); e1.synchronize(); t.append(e0.elapsed_time(e1))
    return sorted(t)[len(t) // 2]

towers = {
    "L14-image": (1024, 4096, 24, [257, 514, 1028]),
    "L14-text": (768, 3072, 12, [16, 77]),
    "B32-image": (768, 3072, 12, [50, 200]),
}
report = {}
for tower, (width, mlp, layers, row_counts) in towers.items():
    shapes = {"qkv": (3 * width, width), "out": (width, width), "c_fc": (mlp, width), "c_proj": (width, mlp)}
    for rows in row_counts:
        total_torch = total_best = total_h0 = 0.0
        for name, (n, k) in shapes.items():
            x = torch.randn(rows, k, device="cuda", dtype=torch.float16)
            ws = [torch.randn(n, k, device="cuda", dtype=torch.float16) / k ** 0.5 for _ in range(layers)]
            b = torch.randn(n, device="cuda", dtype=torch.float16)
            y = torch.empty(rows, n, device="cuda", dtype=torch.float16)
            ref = (x.float() @ ws[0].float().T + b.float())
            torch_err = (F.linear(x, ws[0], b).float() - ref).abs().max().item()
            torch_ms = min(graph_ms(lambda: [F.linear(x, w, b) for w in ws]) for _ in range(2))
            desc = mod.prepare(rows, n, k, b, 64, WS)
            results = []
            for i, d in enumerate(desc):
                try:
                    ms = graph_ms(lambda: [mod.run(x, w, y, workspace, i) for w in ws])
                    mod.run(x, ws[0], y, workspace, i); torch.cuda.synchronize()
                    err = (y.float() - ref).abs().max().item()
                except Exception as exc:  # noqa
                    ms, err = -1.0, -1.0
                results.append({"desc": d, "ms": ms, "err": err})
            ok = [r for r in results if r["ms"] > 0]
            best = min(ok, key=lambda r: r["ms"])
            h0 = results[0]["ms"]
            per = 1000 / layers
            print(f"{tower} rows {rows} {name:6s} torch {torch_ms*per:.2f} us/layer (err {torch_err:.2e}); heuristic#0 {h0*per:.2f}; "
                  f"best {best['ms']*per:.2f} us (err {best['err']:.2e}) desc {best['desc']} of {len(ok)} "
                  f"(heuristic {sum(1 for r in ok if r['desc'][0]==0)})", flush=True)
            total_torch += torch_ms; total_best += best["ms"]; total_h0 += h0
            report[f"{tower}_{rows}_{name}"] = {"torch_ms": torch_ms, "torch_err": torch_err, "results": results}
        print(f"== {tower} rows {rows}: four GEMMs x {layers} layers: torch {total_torch*1000:.1f} us, heuristic#0 {total_h0*1000:.1f}, best {total_best*1000:.1f}", flush=True)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "report": report}, open(sys.argv[1], "w"))
