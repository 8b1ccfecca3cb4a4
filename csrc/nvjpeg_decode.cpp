// Batched JPEG decoding on nvJPEG's hardware decoder (A100/H100 and later), without the GIL: the fast path's
// decode (clip_flash/inputs/image/nvjpeg_packed.py). torchvision's batched decode takes the GIL back about once
// per image, which stalls it beside any thread running Python; this call releases the GIL once for the whole batch.
//
// nvJPEG is opened with dlopen at first use (the library path comes from Python), so the extension neither
// links against it nor needs it to import; without <nvjpeg.h> at build time only a stub is compiled.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>


#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#if __has_include(<nvjpeg.h>)
#include <dlfcn.h>
#include <nvjpeg.h>
#define CLIP_FLASH_HAVE_NVJPEG 1
#else
#define CLIP_FLASH_HAVE_NVJPEG 0
#endif

namespace clip_flash {

#if CLIP_FLASH_HAVE_NVJPEG
namespace {

// The nvJPEG entry points used, resolved from the library by name (prototypes from the toolkit's header).
struct NvjpegApi {
  decltype(&nvjpegCreateEx) create_ex = nullptr;
  decltype(&nvjpegJpegStateCreate) state_create = nullptr;
  decltype(&nvjpegJpegStreamCreate) stream_create = nullptr;
  decltype(&nvjpegJpegStreamParseHeader) parse_header = nullptr;
  decltype(&nvjpegJpegStreamGetFrameDimensions) frame_dimensions = nullptr;
  decltype(&nvjpegJpegStreamGetComponentsNum) components = nullptr;
  decltype(&nvjpegDecodeBatchedSupported) batched_supported = nullptr;
  decltype(&nvjpegDecodeBatchedInitialize) batched_initialize = nullptr;
  decltype(&nvjpegDecodeBatched) decode_batched = nullptr;
};

// Per device: one nvJPEG handle (thread-safe) and up to kMaxDecoders decoders, each a state and a stream
// object (not thread-safe: one call at a time holds a decoder's `busy`). Calls from several threads take
// different decoders, so one call's header parsing need not wait for another's decode. (On an H200, with
// 256 web photos per call, two or four were no faster than one: the hardware decoder itself bounded them.)
constexpr int64_t kMaxDecoders = 8;

struct HardwareDecoder {
  nvjpegJpegState_t state = nullptr;
  nvjpegJpegStream_t stream = nullptr;
  std::mutex busy;
};

struct DeviceDecoders {
  nvjpegHandle_t handle = nullptr;
  std::vector<std::unique_ptr<HardwareDecoder>> decoders;  // made on demand, up to the calls' `decoders`
};

std::mutex setup_mutex;  // guards the library, the devices' handles and their decoder lists
NvjpegApi api;
bool api_loaded = false;
std::vector<std::unique_ptr<DeviceDecoders>> devices;  // by device index; never destroyed (as torchvision)

// Each step returns why it failed (empty: it did not): nothing here throws (see nvjpeg_hw_decode), and messages
// are joined as std::string (see jpeg_chroma_packed in csrc/jpeg_chroma_binding.cpp).
template <typename Function>
std::string resolve(void* library, const char* name, Function* target) {
  *target = reinterpret_cast<Function>(dlsym(library, name));
  return *target != nullptr ? "" : std::string("nvJPEG unavailable: ") + name + " not found in the library";
}

std::string load_api(const std::string& library_path) {
  if (api_loaded) {
    return "";
  }
  void* library = dlopen(library_path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    return "nvJPEG unavailable: cannot open " + library_path + ": " + dlerror();
  }
  for (const std::string& missing :
       {resolve(library, "nvjpegCreateEx", &api.create_ex), resolve(library, "nvjpegJpegStateCreate", &api.state_create),
        resolve(library, "nvjpegJpegStreamCreate", &api.stream_create),
        resolve(library, "nvjpegJpegStreamParseHeader", &api.parse_header),
        resolve(library, "nvjpegJpegStreamGetFrameDimensions", &api.frame_dimensions),
        resolve(library, "nvjpegJpegStreamGetComponentsNum", &api.components),
        resolve(library, "nvjpegDecodeBatchedSupported", &api.batched_supported),
        resolve(library, "nvjpegDecodeBatchedInitialize", &api.batched_initialize),
        resolve(library, "nvjpegDecodeBatched", &api.decode_batched)}) {
    if (!missing.empty()) {
      return missing;
    }
  }
  api_loaded = true;
  return "";
}

std::string make_handle(int device) {
  if (devices.size() <= static_cast<size_t>(device)) {
    devices.resize(device + 1);
  }
  if (devices[device]) {
    return "";
  }
  auto made = std::make_unique<DeviceDecoders>();
  nvjpegStatus_t status = api.create_ex(NVJPEG_BACKEND_HARDWARE, nullptr, nullptr, NVJPEG_FLAGS_DEFAULT,
                                        &made->handle);
  if (status != NVJPEG_STATUS_SUCCESS) {
    return "nvJPEG unavailable: no hardware decoder on device " + std::to_string(device) +
           " (nvjpegCreateEx status " + std::to_string(status) + ")";
  }
  devices[device] = std::move(made);
  return "";
}

// Called with setup_mutex held: appends one decoder to the device's list.
std::string add_decoder(DeviceDecoders& device) {
  auto decoder = std::make_unique<HardwareDecoder>();
  nvjpegStatus_t status = api.state_create(device.handle, &decoder->state);
  if (status != NVJPEG_STATUS_SUCCESS) {
    return "nvjpegJpegStateCreate failed: " + std::to_string(status);
  }
  status = api.stream_create(device.handle, &decoder->stream);
  if (status != NVJPEG_STATUS_SUCCESS) {
    return "nvjpegJpegStreamCreate failed: " + std::to_string(status);
  }
  device.decoders.push_back(std::move(decoder));
  return "";
}

// A decoder for this call, locked in `lock`: a free one among the first `wanted`, made if fewer
// exist; when all are busy, the one after the last handed out (each call waits behind one other at most).
std::string acquire_decoder(DeviceDecoders& decoders, int64_t wanted, HardwareDecoder** chosen,
                            std::unique_lock<std::mutex>* lock) {
  static size_t next = 0;
  std::vector<HardwareDecoder*> candidates;
  {
    std::lock_guard<std::mutex> setup(setup_mutex);
    for (auto& decoder : decoders.decoders) {
      if (static_cast<int64_t>(candidates.size()) < wanted) {
        candidates.push_back(decoder.get());
      }
    }
    for (HardwareDecoder* decoder : candidates) {
      std::unique_lock<std::mutex> attempt(decoder->busy, std::try_to_lock);
      if (attempt.owns_lock()) {
        *chosen = decoder;
        *lock = std::move(attempt);
        return "";
      }
    }
    if (static_cast<int64_t>(candidates.size()) < wanted) {
      std::string failure = add_decoder(decoders);
      if (!failure.empty()) {
        return failure;
      }
      *chosen = decoders.decoders.back().get();
      *lock = std::unique_lock<std::mutex>((*chosen)->busy);
      return "";
    }
    *chosen = candidates[next++ % candidates.size()];
  }
  *lock = std::unique_lock<std::mutex>((*chosen)->busy);  // waited for outside setup_mutex
  return "";
}

}  // namespace

// Decodes the 3-component JPEGs the hardware decoder takes (baseline Huffman) straight into `out`, a 1-D uint8
// CUDA buffer (the resize kernel's packed layout): input i's (H, W, 3) RGB pixels at byte slots[3i], where
// slots[3i + 1], slots[3i + 2] give the H and W its header scan found. Written on the current CUDA stream, and
// waited for. Returns, per input, 1 where it wrote the pixels and 0 where it left them (slot -1, progressive,
// grayscale, unparsable, or a frame size other than the slot's), and why the batch failed (empty: it did not;
// "nvJPEG unavailable: ..." when it cannot run here). It runs without the GIL and throws nothing: a throw from
// such a call crashed the process on the H100 machine. It allocates nothing: a CUDA tensor allocated per image
// took the GIL back each time (measured beside a busy Python thread), as torchvision's call does.
std::tuple<std::vector<int64_t>, std::string> nvjpeg_hw_decode(const std::vector<at::Tensor>& encoded,
                                                               const at::Tensor& out,
                                                               const std::vector<int64_t>& slots,
                                                               const std::string& library_path, int64_t decoders) {
  std::vector<int64_t> written(encoded.size(), 0);
  if (!(out.is_cuda() && out.scalar_type() == at::kByte && out.dim() == 1 && out.is_contiguous())) {
    return {written, "out must be a contiguous 1-D CUDA uint8 tensor"};
  }
  if (slots.size() != 3 * encoded.size()) {
    return {written, "slots must hold (offset, height, width) per input"};
  }
  if (decoders < 1 || decoders > kMaxDecoders) {
    return {written, "decoders must be between 1 and " + std::to_string(kMaxDecoders)};
  }
  for (const auto& data : encoded) {
    if (data.is_cuda() || data.scalar_type() != at::kByte || data.dim() != 1 || !data.is_contiguous()) {
      return {written, "each encoded image must be a contiguous 1-D uint8 CPU tensor"};
    }
  }
  for (size_t index = 0; index < encoded.size(); ++index) {
    const int64_t offset = slots[3 * index], height = slots[3 * index + 1], width = slots[3 * index + 2];
    if (offset >= 0 && (height <= 0 || width <= 0 || offset + height * width * 3 > out.numel())) {
      return {written, "input " + std::to_string(index) + "'s slot lies outside out"};
    }
  }
  const c10::DeviceIndex device = out.device().index();
  const c10::cuda::CUDAGuard device_guard(device);
  std::string failure;
  DeviceDecoders* on_device = nullptr;  // stable: devices holds pointers, never destroyed
  {
    std::lock_guard<std::mutex> setup(setup_mutex);
    failure = load_api(library_path);
    if (failure.empty()) {
      failure = make_handle(static_cast<int>(device));
    }
    if (failure.empty()) {
      on_device = devices[device].get();
    }
  }
  HardwareDecoder* chosen = nullptr;
  std::unique_lock<std::mutex> lock;
  if (failure.empty()) {
    failure = acquire_decoder(*on_device, decoders, &chosen, &lock);
  }
  if (!failure.empty()) {
    return {written, failure};
  }
  const nvjpegHandle_t handle = on_device->handle;
  HardwareDecoder& decoder = *chosen;

  std::vector<const unsigned char*> data;
  std::vector<size_t> lengths;
  std::vector<nvjpegImage_t> images;
  for (size_t index = 0; index < encoded.size(); ++index) {
    const int64_t offset = slots[3 * index], height = slots[3 * index + 1], width = slots[3 * index + 2];
    const auto* bytes = encoded[index].data_ptr<uint8_t>();
    const size_t length = static_cast<size_t>(encoded[index].numel());
    if (offset < 0 || length == 0 ||
        api.parse_header(handle, bytes, length, decoder.stream) != NVJPEG_STATUS_SUCCESS) {
      continue;
    }
    int unsupported = 1;
    unsigned int components = 0, frame_width = 0, frame_height = 0;
    if (api.batched_supported(handle, decoder.stream, &unsupported) != NVJPEG_STATUS_SUCCESS ||
        unsupported != 0 || api.components(decoder.stream, &components) != NVJPEG_STATUS_SUCCESS ||
        components != 3 || api.frame_dimensions(decoder.stream, &frame_width, &frame_height) != NVJPEG_STATUS_SUCCESS ||
        frame_width != width || frame_height != height) {
      continue;
    }
    nvjpegImage_t image{};
    image.channel[0] = out.data_ptr<uint8_t>() + offset;
    image.pitch[0] = static_cast<size_t>(width) * 3;
    written[index] = 1;
    data.push_back(bytes);
    lengths.push_back(length);
    images.push_back(image);
  }
  if (images.empty()) {
    return {written, ""};
  }
  std::vector<int64_t> none(encoded.size(), 0);
  cudaStream_t stream = c10::cuda::getCurrentCUDAStream(device).stream();
  nvjpegStatus_t status = api.batched_initialize(handle, decoder.state, static_cast<int>(images.size()), 1,
                                                 NVJPEG_OUTPUT_RGBI);
  if (status != NVJPEG_STATUS_SUCCESS) {
    return {none, "nvjpegDecodeBatchedInitialize failed: " + std::to_string(status)};
  }
  status = api.decode_batched(handle, decoder.state, data.data(), lengths.data(), images.data(), stream);
  if (status != NVJPEG_STATUS_SUCCESS) {
    return {none, "nvjpegDecodeBatched failed: " + std::to_string(status)};
  }
  // The inputs and the decoder's state are reused by the next call: it starts after this batch is decoded.
  const cudaError_t waited = cudaStreamSynchronize(stream);
  if (waited != cudaSuccess) {
    return {none, std::string("nvJPEG decode failed on the device: ") + cudaGetErrorString(waited)};
  }
  return {written, ""};
}

#else

std::tuple<std::vector<int64_t>, std::string> nvjpeg_hw_decode(const std::vector<at::Tensor>& encoded,
                                                               const at::Tensor&, const std::vector<int64_t>&,
                                                               const std::string&, int64_t) {
  return {std::vector<int64_t>(encoded.size(), 0), "nvJPEG unavailable: the extension was built without <nvjpeg.h>"};
}

#endif

}  // namespace clip_flash
