// The CPU half of the exact path's JPEG route (clip_flash/inputs/jpeg_dct.py): libjpeg-turbo's entropy
// decoding only, into each component's quantized DCT coefficients; the GPU does the rest (csrc/jpeg_dct.cu).
// Entropy decoding is lossless, so any correct libjpeg gives the same coefficients; what Pillow's decoder does
// after it (integer IDCT, upsampling, colour conversion) is integer arithmetic the kernels repeat exactly.
// Entropy decoding is about two thirds of a web photo's decode time: the rest of the CPU work moves to the GPU.
//
// The library is opened at run time (Pillow's own copy, found by the Python side) against the API headers in
// third_party/libjpeg (libjpeg-turbo's jpeg62 ABI), so building needs no libjpeg development files. Nothing
// here throws or touches Python: failures come back as text, and the call runs without the GIL.
#include <ATen/ATen.h>

#include <dlfcn.h>

#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "third_party/libjpeg/jpeglib.h"

namespace clip_flash {
namespace {

// The entry points used, from the library opened at run time.
struct JpegLibrary {
  decltype(&jpeg_std_error) std_error = nullptr;
  decltype(&jpeg_CreateDecompress) create = nullptr;
  decltype(&jpeg_mem_src) mem_src = nullptr;
  decltype(&jpeg_read_header) read_header = nullptr;
  decltype(&jpeg_read_coefficients) read_coefficients = nullptr;
  decltype(&jpeg_destroy_decompress) destroy = nullptr;
  std::string failure;  // why it cannot be used; empty when it can
};

template <typename Function>
bool bind(void* handle, const char* name, Function* target, std::string* failure) {
  *target = reinterpret_cast<Function>(dlsym(handle, name));
  if (*target == nullptr && failure->empty()) *failure = std::string("libjpeg lacks ") + name;
  return *target != nullptr;
}

const JpegLibrary& open_library(const std::string& path) {
  static std::mutex opening;
  static std::map<std::string, JpegLibrary> opened;
  std::lock_guard<std::mutex> lock(opening);
  auto found = opened.find(path);
  if (found != opened.end()) return found->second;
  JpegLibrary& library = opened[path];
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    library.failure = "libjpeg unavailable: cannot open " + path + (why ? std::string(" (") + why + ")" : "");
    return library;
  }
  bind(handle, "jpeg_std_error", &library.std_error, &library.failure);
  bind(handle, "jpeg_CreateDecompress", &library.create, &library.failure);
  bind(handle, "jpeg_mem_src", &library.mem_src, &library.failure);
  bind(handle, "jpeg_read_header", &library.read_header, &library.failure);
  bind(handle, "jpeg_read_coefficients", &library.read_coefficients, &library.failure);
  bind(handle, "jpeg_destroy_decompress", &library.destroy, &library.failure);
  if (!library.failure.empty()) library.failure = "libjpeg unavailable: " + library.failure;
  return library;
}

// libjpeg reports errors by calling error_exit, which must not return: jump back to the call. Warnings
// (corrupt data it worked around) are counted, so that such files take the route that decodes them whole.
struct ErrorTrap {
  jpeg_error_mgr manager;
  std::jmp_buf back;
  char message[JMSG_LENGTH_MAX];
  int warnings;
};

void on_error(j_common_ptr cinfo) {
  auto* trap = reinterpret_cast<ErrorTrap*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, trap->message);
  std::longjmp(trap->back, 1);
}

void on_message(j_common_ptr cinfo, int level) {
  auto* trap = reinterpret_cast<ErrorTrap*>(cinfo->err);
  if (level < 0 && trap->warnings++ == 0) (*cinfo->err->format_message)(cinfo, trap->message);
}

// Why the kernels cannot reproduce Pillow's decode of this frame (empty: they can). They do what libjpeg-turbo
// does with its defaults (islow IDCT, fancy upsampling) for grayscale and YCbCr with 8-bit samples, each
// component at full size, halved across (h2v1), or halved both ways (h2v2), as its upsampler picks them.
std::string unsupported(const jpeg_decompress_struct& cinfo) {
  if (cinfo.data_precision != 8) return "declined: " + std::to_string(cinfo.data_precision) + "-bit samples";
  if (!((cinfo.jpeg_color_space == JCS_YCbCr && cinfo.num_components == 3) ||
        (cinfo.jpeg_color_space == JCS_GRAYSCALE && cinfo.num_components == 1))) {
    return "declined: colour space " + std::to_string(static_cast<int>(cinfo.jpeg_color_space)) + " with " +
           std::to_string(cinfo.num_components) + " components";
  }
  for (int c = 0; c < cinfo.num_components; ++c) {
    const jpeg_component_info& component = cinfo.comp_info[c];
    if (component.h_samp_factor <= 0 || component.v_samp_factor <= 0 ||
        cinfo.max_h_samp_factor % component.h_samp_factor != 0 ||
        cinfo.max_v_samp_factor % component.v_samp_factor != 0) {
      return "declined: sampling factors that do not divide";
    }
    const int across = cinfo.max_h_samp_factor / component.h_samp_factor;
    const int down = cinfo.max_v_samp_factor / component.v_samp_factor;
    const bool full = across == 1 && down == 1;
    // libjpeg-turbo interpolates a halved component only when it is more than 2 samples wide.
    const bool halved = across == 2 && (down == 1 || down == 2) && component.downsampled_width > 2;
    if (!full && !halved) {
      return "declined: component " + std::to_string(c) + " upsampled " + std::to_string(across) + "x" +
             std::to_string(down);
    }
    if (component.quant_table == nullptr) return "declined: a component without coefficients";
  }
  return "";
}

}  // namespace

// One JPEG's quantized coefficients: (bytes of int16 values, layout, failure). The bytes are the start of `out`
// (a contiguous CPU uint8 tensor, e.g. the worker's region of the pixel arena) where they fit there, else a new
// tensor: a large copy less per image. They hold, per component, its quantization table (64 values in natural
// order, as libjpeg-turbo's SIMD IDCT reads them: int16), then its blocks row by row (64 coefficients each,
// natural order). The layout is
// [height, width, components, then per component: across, down, width_in_blocks, height_in_blocks,
//  downsampled_width, downsampled_height, offset of its table in the tensor (in int16 values)].
// `failure` starts with "libjpeg unavailable" when the library cannot be used, with "declined" for a frame the
// kernels do not reproduce, and is libjpeg's message (or first warning) otherwise.
std::tuple<at::Tensor, std::vector<int64_t>, std::string> jpeg_read_dct(const at::Tensor& data,
                                                                         const std::string& library_path,
                                                                         const at::Tensor& out) {
  const auto empty = [] { return at::empty({0}, at::TensorOptions().dtype(at::kByte)); };
  if (!(data.device().is_cpu() && data.scalar_type() == at::kByte && data.dim() == 1 && data.is_contiguous())) {
    return {empty(), {}, "data must be a contiguous 1-D CPU uint8 tensor"};
  }
  if (out.defined() && !(out.device().is_cpu() && out.scalar_type() == at::kByte && out.dim() == 1 &&
                         out.is_contiguous() && reinterpret_cast<uintptr_t>(out.data_ptr()) % 2 == 0)) {
    return {empty(), {}, "out must be a contiguous, 2-byte aligned 1-D CPU uint8 tensor"};
  }
  const JpegLibrary& library = open_library(library_path);
  if (!library.failure.empty()) return {empty(), {}, library.failure};

  jpeg_decompress_struct cinfo;
  ErrorTrap trap;
  std::memset(&cinfo, 0, sizeof(cinfo));
  std::memset(&trap, 0, sizeof(trap));
  cinfo.err = library.std_error(&trap.manager);
  trap.manager.error_exit = on_error;
  trap.manager.emit_message = on_message;
  // Only plain data lives across the jump (no destructors skipped); what is built after it is returned.
  at::Tensor coefficients;
  std::vector<int64_t> layout;
  std::string failure;
  if (setjmp(trap.back) != 0) {
    library.destroy(&cinfo);
    return {empty(), {}, std::string("libjpeg: ") + trap.message};
  }
  library.create(&cinfo, JPEG_LIB_VERSION, sizeof(cinfo));
  library.mem_src(&cinfo, data.data_ptr<uint8_t>(), static_cast<unsigned long>(data.numel()));
  library.read_header(&cinfo, TRUE);
  jvirt_barray_ptr* arrays = library.read_coefficients(&cinfo);
  failure = trap.warnings > 0 ? std::string("libjpeg warned: ") + trap.message : unsupported(cinfo);
  if (failure.empty()) {
    int64_t total = 0;
    layout = {cinfo.image_height, cinfo.image_width, cinfo.num_components};
    for (int c = 0; c < cinfo.num_components; ++c) {
      const jpeg_component_info& component = cinfo.comp_info[c];
      layout.insert(layout.end(), {cinfo.max_h_samp_factor / component.h_samp_factor,
                                   cinfo.max_v_samp_factor / component.v_samp_factor, component.width_in_blocks,
                                   component.height_in_blocks, component.downsampled_width,
                                   component.downsampled_height, total});
      total += DCTSIZE2 * (1 + static_cast<int64_t>(component.width_in_blocks) * component.height_in_blocks);
    }
    const bool in_place = out.defined() && out.numel() >= 2 * total;
    coefficients = in_place ? out.narrow(0, 0, 2 * total)
                            : at::empty({2 * total}, at::TensorOptions().dtype(at::kByte));
    int16_t* write = reinterpret_cast<int16_t*>(coefficients.data_ptr<uint8_t>());
    for (int c = 0; c < cinfo.num_components; ++c) {
      const jpeg_component_info& component = cinfo.comp_info[c];
      for (int k = 0; k < DCTSIZE2; ++k) write[k] = static_cast<int16_t>(component.quant_table->quantval[k]);
      write += DCTSIZE2;
      const size_t row_bytes = sizeof(JBLOCK) * component.width_in_blocks;
      for (JDIMENSION row = 0; row < component.height_in_blocks; ++row) {
        JBLOCKARRAY blocks = (*cinfo.mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(&cinfo), arrays[c],
                                                              row, 1, FALSE);
        std::memcpy(write, blocks[0], row_bytes);
        write += DCTSIZE2 * component.width_in_blocks;
      }
    }
  }
  library.destroy(&cinfo);
  if (!failure.empty()) return {empty(), {}, failure};
  return {coefficients, layout, ""};
}

}  // namespace clip_flash
