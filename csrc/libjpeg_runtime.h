// The libjpeg that Pillow decodes with, opened at run time (Pillow's own bundled copy, found by the Python side)
// against the API headers in third_party/libjpeg (libjpeg-turbo's jpeg62 ABI): building needs no libjpeg
// development files, and a decode here runs the very library, and so the very arithmetic, Pillow's does.
#pragma once

#include <dlfcn.h>

#include <csetjmp>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "third_party/libjpeg/jpeglib.h"

namespace clip_flash {
namespace libjpeg {

// The entry points used.
struct Library {
  decltype(&jpeg_std_error) std_error = nullptr;
  decltype(&jpeg_CreateDecompress) create = nullptr;
  decltype(&jpeg_mem_src) mem_src = nullptr;
  decltype(&jpeg_read_header) read_header = nullptr;
  decltype(&jpeg_read_coefficients) read_coefficients = nullptr;
  decltype(&jpeg_start_decompress) start_decompress = nullptr;
  decltype(&jpeg_read_scanlines) read_scanlines = nullptr;
  decltype(&jpeg_finish_decompress) finish_decompress = nullptr;
  decltype(&jpeg_destroy_decompress) destroy = nullptr;
  std::string failure;  // why it cannot be used; empty when it can
};

template <typename Function>
inline void bind(void* handle, const char* name, Function* target, std::string* failure) {
  *target = reinterpret_cast<Function>(dlsym(handle, name));
  if (*target == nullptr && failure->empty()) *failure = std::string("libjpeg lacks ") + name;
}

// Opened once per path and kept for the process's life (decoders on other threads may be using it).
inline const Library& open_library(const std::string& path) {
  static std::mutex opening;
  static std::map<std::string, Library>* opened = new std::map<std::string, Library>();
  std::lock_guard<std::mutex> lock(opening);
  auto found = opened->find(path);
  if (found != opened->end()) return found->second;
  Library& library = (*opened)[path];
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
  bind(handle, "jpeg_start_decompress", &library.start_decompress, &library.failure);
  bind(handle, "jpeg_read_scanlines", &library.read_scanlines, &library.failure);
  bind(handle, "jpeg_finish_decompress", &library.finish_decompress, &library.failure);
  bind(handle, "jpeg_destroy_decompress", &library.destroy, &library.failure);
  if (!library.failure.empty()) library.failure = "libjpeg unavailable: " + library.failure;
  return library;
}

// libjpeg reports errors by calling error_exit, which must not return: jump back to the call. Warnings
// (corrupt data it worked around) are counted, so that such files go where Pillow's own handling decides.
struct ErrorTrap {
  jpeg_error_mgr manager;
  std::jmp_buf back;
  char message[JMSG_LENGTH_MAX];
  int warnings;
};

inline void on_error(j_common_ptr cinfo) {
  auto* trap = reinterpret_cast<ErrorTrap*>(cinfo->err);
  (*cinfo->err->format_message)(cinfo, trap->message);
  std::longjmp(trap->back, 1);
}

inline void on_message(j_common_ptr cinfo, int level) {
  auto* trap = reinterpret_cast<ErrorTrap*>(cinfo->err);
  if (level < 0 && trap->warnings++ == 0) (*cinfo->err->format_message)(cinfo, trap->message);
}

// Why the GPU kernels (csrc/jpeg_dct.cu) cannot reproduce Pillow's decode of this frame (empty: they can).
// They do what libjpeg-turbo does with its defaults (islow IDCT, fancy upsampling) for grayscale and YCbCr
// with 8-bit samples, each component at full size, halved across (h2v1), or halved both ways (h2v2).
// Valid after jpeg_read_header.
inline std::string dct_unsupported(const jpeg_decompress_struct& cinfo) {
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
  }
  return "";
}

// The coefficients' layout and their size in bytes; valid after jpeg_read_header (which computes the
// components' block counts). The bytes hold, per component, its quantization table (64 int16 in natural order,
// as libjpeg-turbo's SIMD IDCT reads them), then its blocks row by row (64 coefficients each, natural order).
// The layout is [height, width, components, then per component: across, down, width_in_blocks,
// height_in_blocks, downsampled_width, downsampled_height, offset of its table (in int16 values)].
inline int64_t dct_layout(const jpeg_decompress_struct& cinfo, std::vector<int64_t>* layout) {
  int64_t total = 0;
  *layout = {cinfo.image_height, cinfo.image_width, cinfo.num_components};
  for (int c = 0; c < cinfo.num_components; ++c) {
    const jpeg_component_info& component = cinfo.comp_info[c];
    layout->insert(layout->end(), {cinfo.max_h_samp_factor / component.h_samp_factor,
                                   cinfo.max_v_samp_factor / component.v_samp_factor, component.width_in_blocks,
                                   component.height_in_blocks, component.downsampled_width,
                                   component.downsampled_height, total});
    total += DCTSIZE2 * (1 + static_cast<int64_t>(component.width_in_blocks) * component.height_in_blocks);
  }
  return 2 * total;
}

// After jpeg_read_coefficients: each component's quantization table (64 int16 in natural order) then its
// blocks row by row, into `write` (room for dct_layout's size). False when a component has no table.
inline bool copy_coefficients(jpeg_decompress_struct* cinfo, jvirt_barray_ptr* arrays, int16_t* write) {
  for (int c = 0; c < cinfo->num_components; ++c) {
    const jpeg_component_info& component = cinfo->comp_info[c];
    if (component.quant_table == nullptr) return false;
    for (int k = 0; k < DCTSIZE2; ++k) write[k] = static_cast<int16_t>(component.quant_table->quantval[k]);
    write += DCTSIZE2;
    const size_t row_bytes = sizeof(JBLOCK) * component.width_in_blocks;
    for (JDIMENSION row = 0; row < component.height_in_blocks; ++row) {
      JBLOCKARRAY blocks = (*cinfo->mem->access_virt_barray)(reinterpret_cast<j_common_ptr>(cinfo), arrays[c],
                                                             row, 1, FALSE);
      std::memcpy(write, blocks[0], row_bytes);
      write += DCTSIZE2 * component.width_in_blocks;
    }
  }
  return true;
}

}  // namespace libjpeg
}  // namespace clip_flash
