// The exact path's CPU step for a whole batch in one call (clip_flash/inputs/image/native_decode.py): on a pool
// of native threads, each input file is read, its JPEG header scanned and, with Pillow's own libjpeg
// (libjpeg_runtime.h), either entropy-decoded into DCT coefficients (the GPU finishes the decode, see
// jpeg_dct.cu) or decoded whole into pixels, each straight into the page-locked buffer the GPU reads; plain
// 8-bit grayscale and RGB PNGs are inflated and unfiltered into pixels the same way (png_decoder.h). What
// Pillow prepares its own way (other formats, modes, damaged files) is left to the Python side, which
// gives Pillow's own pixels, rows or reasons. Nothing here throws or touches Python.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

namespace clip_flash {

// What an input became in the scan (values shared with the Python side: DecodeKind in native_decode.py).
enum class DecodeKind : int64_t {
  kPython = 0,        // left to Pillow on the Python side (note says why)
  kCoefficients = 1,  // entropy-decoded into DCT coefficients for the GPU kernels
  kPixels = 2,        // decoded whole into uint8 (H, W, C) pixels, Pillow's
  kEncoded = 3,       // a JPEG whose bytes go to nvJPEG (decode="gpu")
};

// What the scan is for (values shared with the Python side: ScanMode in native_decode.py).
enum class ScanMode : int64_t {
  kPixels = 0,        // exact: decode every JPEG whole
  kCoefficients = 1,  // exact, GPU: coefficients where the kernels reproduce Pillow's decode, else whole
  kEncoded = 2,       // fast path: complete-looking plain JPEGs stay encoded for nvJPEG, the rest decode whole
};

// What an input's file is (values shared with the Python side: FileFormat in native_decode.py).
enum class FileFormat : int64_t {
  kOther = 0,
  kJpeg = 1,
  kPng = 2,
};

// Columns of ScannedBatch::info().
constexpr int kInfoFields = 9;  // kind, height, width, channels, sampling, progressive, coefficient bytes, size,
                                // format
constexpr int kLayoutFields = 3 + 7 * 3;  // the coefficients' layout (libjpeg_runtime.h), zero padded

// A path, or encoded bytes that the caller keeps alive and unchanged until the scan's batch is gone (the binding
// keeps the Python bytes objects with the batch): a batch of one-JPEG requests is scanned without copying its
// bytes under the GIL.
struct DecodeSource {
  bool is_path = false;
  std::string path;
  std::string_view bytes;
};

struct ScannedItem {
  std::string read;  // a path's bytes, read by the scan
  std::string_view given;  // the source's bytes (not a path)
  bool from_path = false;
  // The file's bytes (a view of `read` made on each call: a copied or moved item stays right).
  std::string_view data() const { return from_path ? std::string_view(read) : given; }
  DecodeKind kind = DecodeKind::kPython;
  FileFormat format = FileFormat::kOther;
  std::string note;  // why kPython, or why a slower route was taken
  int64_t height = 0, width = 0, channels = 0;
  int64_t sampling = -1;  // Pillow's get_sampling (0 4:4:4, 1 4:2:2, 2 4:2:0, -1 other)
  bool progressive = false;
  std::vector<int64_t> layout;  // kCoefficients: the coefficients' layout
  int64_t coefficient_bytes = 0;
};

struct ScannedBatch {
  std::vector<ScannedItem> items;
  std::shared_ptr<void> sources;  // what keeps the bytes the items view alive (set by the binding)
  std::vector<int64_t> info() const;  // row-major (items, kInfoFields)
  std::vector<int64_t> layouts() const;  // row-major (items, kLayoutFields)
};

// Runs `task(i)` for i in [0, count) on its threads and the calling one; one batch at a time. A run with tasks
// for fewer than half the threads wakes only that many, and a run returns once every task is done: a thread still
// waking up (or descheduled) when the others have taken all the tasks does not hold the caller up.
class TaskPool {
 public:
  explicit TaskPool(int threads);
  ~TaskPool();
  TaskPool(const TaskPool&) = delete;
  TaskPool& operator=(const TaskPool&) = delete;
  void run(size_t count, const std::function<void(size_t)>& task);
  int threads() const { return static_cast<int>(workers_.size()) + 1; }

 private:
  // One call's tasks. A thread that picks it up late finds every index taken and never calls `task`, which
  // lives only as long as the call.
  struct Run {
    const std::function<void(size_t)>* task = nullptr;
    size_t count = 0;
    std::atomic<size_t> next{0};
    std::atomic<size_t> finished{0};
  };
  void work();
  void drain(Run& run);
  std::mutex calls_;  // one run at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::shared_ptr<Run> current_;  // the run being worked on (guarded by mutex_)
  uint64_t generation_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

class ImageBatchDecoder {
 public:
  ImageBatchDecoder(int threads, std::string library_path);
  // Why the library cannot be used (empty: it can).
  const std::string& failure() const;
  int threads() const { return pool_.threads(); }
  // Reads and scans every source; sizes past max_pixels (> 0) are left to Pillow's decompression-bomb check.
  // The items at the positions in `exact` are scanned as kCoefficients whatever `mode` says (with kEncoded:
  // the share of a batch's JPEGs the CPU decodes exactly beside nvJPEG's hardware decoder).
  std::shared_ptr<ScannedBatch> scan(std::vector<DecodeSource> sources, ScanMode mode, int64_t max_pixels,
                                     const std::vector<int64_t>& exact = {});
  // Decodes the kCoefficients and kPixels items whose offset is >= 0 into their buffers (capacities checked);
  // returns per item why it could not (empty: written), the item then being left to Pillow. With `split_jpegs`,
  // a batch of at most split_at_most(threads()) coefficient items (a single request) has each one's entropy
  // decode split across the pool in turn (jpeg_entropy_split.h: the same coefficients, sooner); what that
  // declines is decoded by libjpeg as the others are.
  std::vector<std::string> decode(const ScannedBatch& batch, uint8_t* pixels, int64_t pixel_capacity,
                                  const int64_t* pixel_offsets, uint8_t* coefficients, int64_t coefficient_capacity,
                                  const int64_t* coefficient_offsets, bool split_jpegs = true);
  // Since this decoder was made: JPEGs split, split decodes declined (then decoded by libjpeg), the split JPEGs'
  // pieces, those decoded again (their guessed start missed), and the last reason a split was declined.
  struct SplitTotals {
    int64_t split = 0, declined = 0, pieces = 0, decoded_again = 0;
    std::string last_declined;
  };
  SplitTotals split_totals() const;

 private:
  std::string library_path_;
  TaskPool pool_;
  mutable std::mutex totals_lock_;
  SplitTotals totals_;
};

// How many coefficient JPEGs a batch splits (one after another, each across all the threads): one JPEG from
// kMinThreadsToSplit threads on, and one per kThreadsPerSplitJpeg threads. On 16 threads a split JPEG took about a
// third of one thread's time, so splitting n of them in turn beats decoding them side by side only while n stays
// under about three.
constexpr int kThreadsPerSplitJpeg = 8;
constexpr int kMinThreadsToSplit = 4;
inline size_t split_at_most(int threads) {
  return threads < kMinThreadsToSplit ? 0 : std::max<size_t>(1, static_cast<size_t>(threads / kThreadsPerSplitJpeg));
}

}  // namespace clip_flash
