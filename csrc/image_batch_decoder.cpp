// The batch decoder (image_batch_decoder.h): the thread pool, the header scan, and libjpeg's decodes.
#include "image_batch_decoder.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <numeric>
#include <utility>

#include "jpeg_entropy_split.h"
#include "libjpeg_runtime.h"
#include "png_decoder.h"

namespace clip_flash {

// ----- the pool -----------------------------------------------------------------------------------------
TaskPool::TaskPool(int threads) {
  for (int i = 1; i < std::max(threads, 1); ++i) workers_.emplace_back([this] { work(); });
}

TaskPool::~TaskPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void TaskPool::drain(Run& run) {
  for (size_t i = run.next.fetch_add(1); i < run.count; i = run.next.fetch_add(1)) {
    (*run.task)(i);
    if (run.finished.fetch_add(1) + 1 == run.count) {
      std::lock_guard<std::mutex> lock(mutex_);  // the caller checks `finished` under it: no lost wake-up
      done_.notify_all();
    }
  }
}

void TaskPool::run(size_t count, const std::function<void(size_t)>& task) {
  if (count == 0) return;
  if (count == 1 || workers_.empty()) {  // a single request: no thread woken (each costs a context switch)
    for (size_t i = 0; i < count; ++i) task(i);
    return;
  }
  std::lock_guard<std::mutex> call(calls_);
  auto run = std::make_shared<Run>();
  run->task = &task;
  run->count = count;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = run;
    ++generation_;
  }
  const size_t helpers = std::min(count - 1, workers_.size());
  if (2 * helpers >= workers_.size()) {  // one wake-up call for all: cheaper than many for most
    wake_.notify_all();
  } else {
    for (size_t i = 0; i < helpers; ++i) wake_.notify_one();
  }
  drain(*run);
  std::unique_lock<std::mutex> lock(mutex_);
  done_.wait(lock, [&] { return run->finished.load() == count; });
  current_.reset();
}

void TaskPool::work() {
  uint64_t seen = 0;
  while (true) {
    std::shared_ptr<Run> run;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || (generation_ != seen && current_ != nullptr); });
      if (stopping_) return;
      seen = generation_;
      run = current_;
    }
    drain(*run);
  }
}

// ----- one input ----------------------------------------------------------------------------------------
namespace {

bool read_file(const std::string& path, std::string* data, std::string* failure) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    *failure = std::string("cannot open the file: ") + std::strerror(errno);
    return false;
  }
  struct stat status;
  if (::fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    *failure = "not a regular file";
    ::close(fd);
    return false;
  }
  bool ok = true;
  {
    data->resize(static_cast<size_t>(status.st_size));
    size_t done = 0;
    while (done < data->size()) {
      const ssize_t got = ::read(fd, &(*data)[done], data->size() - done);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) break;
      done += static_cast<size_t>(got);
    }
    ok = done == data->size();  // a file that shrank meanwhile: Pillow decides
  }
  if (!ok) *failure = "cannot read the whole file";
  ::close(fd);
  return ok;
}

struct Header {
  int64_t height = 0, width = 0, channels = 0, sampling = -1;
  bool progressive = false;
};

// The frame header of a plain 8-bit JPEG with 1 or 3 components, read up to its first scan; false for
// anything Pillow might read differently (the same rules as clip_flash/inputs/image/jpeg_header.py): a
// multi-picture (MPF) or Adobe-marked file, another frame type, fill bytes outside markers, a second frame
// header, a zero size, or segments that run past the data. Such files go to Pillow.
bool scan_header(std::string_view bytes, Header* header) {
  const auto* data = reinterpret_cast<const uint8_t*>(bytes.data());
  const size_t size = bytes.size();
  if (size < 4 || data[0] != 0xFF || data[1] != 0xD8 || data[2] != 0xFF) return false;
  size_t position = 2;
  bool framed = false;
  while (position + 4 <= size) {
    if (data[position] != 0xFF) return false;
    while (position < size && data[position] == 0xFF) ++position;
    if (position + 3 > size) return false;
    const int marker = data[position];
    const size_t length = (static_cast<size_t>(data[position + 1]) << 8) | data[position + 2];
    const size_t start = position + 3, end = position + 1 + length;
    if (marker == 0xD8 || marker == 0x01 || (marker >= 0xD0 && marker <= 0xD9) || length < 2 || end > size) {
      return false;
    }
    if (marker == 0xDA) return framed;
    const bool plain = marker == 0xC0 || marker == 0xC1 || marker == 0xC2;
    if (!plain && marker >= 0xC3 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC) {
      return false;
    }
    if ((marker == 0xE2 && end - start >= 4 && std::memcmp(data + start, "MPF\0", 4) == 0) ||
        (marker == 0xEE && end - start >= 5 && std::memcmp(data + start, "Adobe", 5) == 0)) {
      return false;
    }
    if (plain) {
      if (framed || end - start < 6) return false;
      const int bits = data[start];
      const int64_t height = (data[start + 1] << 8) | data[start + 2];
      const int64_t width = (data[start + 3] << 8) | data[start + 4];
      const int components = data[start + 5];
      if (bits != 8 || (components != 1 && components != 3) || height == 0 || width == 0 ||
          end - start < static_cast<size_t>(6 + 3 * components)) {
        return false;
      }
      header->height = height;
      header->width = width;
      header->channels = components;
      header->sampling = -1;
      if (components == 3) {
        int factors[6];
        for (int c = 0; c < 3; ++c) {
          factors[2 * c] = data[start + 7 + 3 * c] >> 4;
          factors[2 * c + 1] = data[start + 7 + 3 * c] & 15;
        }
        const bool rest_one = factors[2] == 1 && factors[3] == 1 && factors[4] == 1 && factors[5] == 1;
        if (rest_one && factors[0] == 1 && factors[1] == 1) header->sampling = 0;
        if (rest_one && factors[0] == 2 && factors[1] == 1) header->sampling = 1;
        if (rest_one && factors[0] == 2 && factors[1] == 2) header->sampling = 2;
      }
      header->progressive = marker == 0xC2;
      framed = true;
    }
    position = end;
  }
  return false;
}

// One libjpeg decompression of `data`, from setup to destroy. The steps run inside the jump's scope, and hold
// only plain data across it.
class Decompression {
 public:
  explicit Decompression(const libjpeg::Library& library) : library_(library) {
    std::memset(&cinfo_, 0, sizeof(cinfo_));
    std::memset(&trap_, 0, sizeof(trap_));
    cinfo_.err = library_.std_error(&trap_.manager);
    trap_.manager.error_exit = libjpeg::on_error;
    trap_.manager.emit_message = libjpeg::on_message;
  }
  ~Decompression() {
    if (created_) library_.destroy(&cinfo_);
  }

  // The header's checks (exact decode): what Pillow would open as mode L or RGB, the same size. Empty: fine.
  std::string header(std::string_view data, const Header& expected) {
    if (setjmp(trap_.back) != 0) return std::string("libjpeg: ") + trap_.message;
    read_header(data);
    return checked(expected);
  }

  std::string layout(std::vector<int64_t>* layout, int64_t* bytes) {
    const std::string declined = libjpeg::dct_unsupported(cinfo_);
    if (declined.empty()) *bytes = libjpeg::dct_layout(cinfo_, layout);
    return declined;
  }

  // Entropy decoding into `out` (`capacity` bytes); the layout must be `expected`'s.
  std::string coefficients(std::string_view data, const Header& expected, const std::vector<int64_t>& layout,
                           uint8_t* out, int64_t capacity) {
    if (setjmp(trap_.back) != 0) return std::string("libjpeg: ") + trap_.message;
    read_header(data);
    std::string failure = checked(expected);
    if (!failure.empty()) return failure;
    jvirt_barray_ptr* arrays = library_.read_coefficients(&cinfo_);
    if (trap_.warnings > 0) return std::string("libjpeg warned: ") + trap_.message;
    std::vector<int64_t> seen;
    const int64_t bytes = libjpeg::dct_layout(cinfo_, &seen);
    if (seen != layout || bytes > capacity) return "the coefficients' layout changed since the scan";
    if (!libjpeg::copy_coefficients(&cinfo_, arrays, reinterpret_cast<int16_t*>(out))) {
      return "a component without coefficients";
    }
    return "";
  }

  // The coefficients of coefficients(), the header read by libjpeg as there and the entropy decode split across
  // `pieces` threads (jpeg_entropy_split.h). Empty: written; otherwise why not (decode with coefficients()).
  std::string split_coefficients(std::string_view data, const Header& expected, const std::vector<int64_t>& layout,
                                 uint8_t* out, int64_t capacity, int pieces,
                                 const entropy_split::ParallelFor& parallel_for, entropy_split::SplitCounts* counts) {
    if (setjmp(trap_.back) != 0) return std::string("libjpeg: ") + trap_.message;
    read_header(data);
    std::string failure = checked(expected);
    if (!failure.empty()) return failure;
    std::vector<int64_t> seen;
    const int64_t bytes = libjpeg::dct_layout(cinfo_, &seen);
    if (seen != layout || bytes > capacity) return "the coefficients' layout changed since the scan";
    if (cinfo_.progressive_mode || cinfo_.arith_code) return "progressive or arithmetic coding";
    if (cinfo_.restart_interval != 0) return "restart markers";
    if (cinfo_.comps_in_scan != cinfo_.num_components) return "more than one scan";
    if (cinfo_.Ss != 0 || cinfo_.Se != DCTSIZE2 - 1 || cinfo_.Ah != 0 || cinfo_.Al != 0) return "not a sequential scan";
    // The layout of copy_coefficients: per component its quantization table, then its blocks.
    auto* write = reinterpret_cast<int16_t*>(out);
    std::vector<int16_t*> blocks(cinfo_.num_components);
    for (int c = 0; c < cinfo_.num_components; ++c) {
      const jpeg_component_info& component = cinfo_.comp_info[c];
      const int table = component.quant_tbl_no;
      if (table < 0 || table >= NUM_QUANT_TBLS || cinfo_.quant_tbl_ptrs[table] == nullptr) {
        return "a component without a quantization table";
      }
      for (int k = 0; k < DCTSIZE2; ++k) write[k] = static_cast<int16_t>(cinfo_.quant_tbl_ptrs[table]->quantval[k]);
      blocks[c] = write + DCTSIZE2;
      write += DCTSIZE2 * (1 + static_cast<int64_t>(component.width_in_blocks) * component.height_in_blocks);
    }
    const bool interleaved = cinfo_.comps_in_scan > 1;
    // One spec per table (DC tables first, then AC): components sharing a table share it, and it is built once.
    std::vector<entropy_split::HuffmanSpec> specs(2 * NUM_HUFF_TBLS);
    entropy_split::Scan scan;
    for (int j = 0; j < cinfo_.comps_in_scan; ++j) {
      const jpeg_component_info& component = *cinfo_.cur_comp_info[j];
      const int dc = component.dc_tbl_no, ac = component.ac_tbl_no;
      if (dc < 0 || dc >= NUM_HUFF_TBLS || ac < 0 || ac >= NUM_HUFF_TBLS || cinfo_.dc_huff_tbl_ptrs[dc] == nullptr ||
          cinfo_.ac_huff_tbl_ptrs[ac] == nullptr) {
        return "a component without its Huffman tables";  // libjpeg-turbo would use the standard ones
      }
      entropy_split::HuffmanSpec& dc_spec = specs[dc];
      entropy_split::HuffmanSpec& ac_spec = specs[NUM_HUFF_TBLS + ac];
      std::memcpy(dc_spec.bits, cinfo_.dc_huff_tbl_ptrs[dc]->bits, sizeof(dc_spec.bits));
      std::memcpy(dc_spec.values, cinfo_.dc_huff_tbl_ptrs[dc]->huffval, sizeof(dc_spec.values));
      std::memcpy(ac_spec.bits, cinfo_.ac_huff_tbl_ptrs[ac]->bits, sizeof(ac_spec.bits));
      std::memcpy(ac_spec.values, cinfo_.ac_huff_tbl_ptrs[ac]->huffval, sizeof(ac_spec.values));
      entropy_split::ScanComponent part;
      part.across = interleaved ? component.h_samp_factor : 1;
      part.down = interleaved ? component.v_samp_factor : 1;
      part.width_in_blocks = component.width_in_blocks;
      part.height_in_blocks = component.height_in_blocks;
      part.blocks = blocks[component.component_index];
      part.dc = &dc_spec;
      part.ac = &ac_spec;
      scan.components.push_back(part);
    }
    if (interleaved) {  // per_scan_setup's MCU grid
      scan.mcus_across = (cinfo_.image_width + 8 * cinfo_.max_h_samp_factor - 1) / (8 * cinfo_.max_h_samp_factor);
      scan.mcus_down = (cinfo_.image_height + 8 * cinfo_.max_v_samp_factor - 1) / (8 * cinfo_.max_v_samp_factor);
    } else {
      scan.mcus_across = scan.components[0].width_in_blocks;
      scan.mcus_down = scan.components[0].height_in_blocks;
    }
    scan.data = cinfo_.src->next_input_byte;
    scan.size = cinfo_.src->bytes_in_buffer;
    return entropy_split::decode(scan, pieces, parallel_for, counts);
  }

  // The whole decode with Pillow's settings (out_color_space RGB or GRAYSCALE; libjpeg's defaults otherwise:
  // islow IDCT, fancy upsampling) into `out`, rows of width * channels bytes.
  std::string pixels(std::string_view data, const Header& expected, uint8_t* out) {
    if (setjmp(trap_.back) != 0) return std::string("libjpeg: ") + trap_.message;
    read_header(data);
    std::string failure = checked(expected);
    if (!failure.empty()) return failure;
    cinfo_.out_color_space = expected.channels == 3 ? JCS_RGB : JCS_GRAYSCALE;
    library_.start_decompress(&cinfo_);
    if (static_cast<int64_t>(cinfo_.output_height) != expected.height ||
        static_cast<int64_t>(cinfo_.output_width) != expected.width ||
        cinfo_.output_components != expected.channels) {
      return "libjpeg's output is not the header's size";
    }
    const size_t row_bytes = static_cast<size_t>(expected.width * expected.channels);
    JSAMPROW rows[16];
    while (cinfo_.output_scanline < cinfo_.output_height) {
      const JDIMENSION first = cinfo_.output_scanline;
      const JDIMENSION want = std::min<JDIMENSION>(16, cinfo_.output_height - first);
      for (JDIMENSION r = 0; r < want; ++r) rows[r] = out + (first + r) * row_bytes;
      if (library_.read_scanlines(&cinfo_, rows, want) == 0) return "libjpeg returned no rows";
    }
    library_.finish_decompress(&cinfo_);
    if (trap_.warnings > 0) return std::string("libjpeg warned: ") + trap_.message;
    return "";
  }

 private:
  // Inside the methods' jump scope: creating reports a library of another interface by error_exit.
  void create() {
    if (created_) return;
    library_.create(&cinfo_, JPEG_LIB_VERSION, sizeof(cinfo_));
    created_ = true;
  }

  // Inside the calling method's jump scope (libjpeg's errors jump back to it; nothing here needs unwinding).
  void read_header(std::string_view data) {
    create();
    library_.mem_src(&cinfo_, reinterpret_cast<const unsigned char*>(data.data()),
                     static_cast<unsigned long>(data.size()));
    library_.read_header(&cinfo_, TRUE);
  }

  std::string checked(const Header& expected) {
    if (trap_.warnings > 0) return std::string("libjpeg warned: ") + trap_.message;
    if (cinfo_.data_precision != 8) return "not 8-bit samples";
    if (cinfo_.num_components != expected.channels || static_cast<int64_t>(cinfo_.image_height) != expected.height ||
        static_cast<int64_t>(cinfo_.image_width) != expected.width) {
      return "libjpeg reads another frame than the header scan";
    }
    const bool colour = expected.channels == 3 &&
                        (cinfo_.jpeg_color_space == JCS_YCbCr || cinfo_.jpeg_color_space == JCS_RGB);
    const bool gray = expected.channels == 1 && cinfo_.jpeg_color_space == JCS_GRAYSCALE;
    return colour || gray ? "" : "colour space " + std::to_string(static_cast<int>(cinfo_.jpeg_color_space));
  }

  const libjpeg::Library& library_;
  jpeg_decompress_struct cinfo_;
  libjpeg::ErrorTrap trap_;
  bool created_ = false;
};

Header header_of(const ScannedItem& item) {
  Header header;
  header.height = item.height;
  header.width = item.width;
  header.channels = item.channels;
  header.sampling = item.sampling;
  header.progressive = item.progressive;
  return header;
}

// The item's size, unless it is past Pillow's decompression-bomb limit (then false, and Pillow decides).
bool sized(ScannedItem* item, int64_t height, int64_t width, int64_t channels, int64_t max_pixels) {
  if (max_pixels > 0 && height * width > max_pixels) {
    item->note = "past Pillow's decompression-bomb limit (Pillow decides)";
    return false;
  }
  item->height = height;
  item->width = width;
  item->channels = channels;
  return true;
}

void scan_one(const libjpeg::Library& library, DecodeSource& source, ScanMode mode, int64_t max_pixels,
              ScannedItem* item) {
  std::string failure;
  if (source.is_path) {
    if (!read_file(source.path, &item->read, &failure)) {
      item->note = failure;
      return;
    }
    item->from_path = true;
  } else {
    item->given = source.bytes;
  }
  if (png::is_png(item->data())) {
    item->format = FileFormat::kPng;
    png::Header png_header;
    failure = png::scan(item->data(), &png_header);
    if (!failure.empty()) {
      item->note = "PNG: " + failure + " (Pillow decodes it)";
      return;
    }
    if (sized(item, png_header.height, png_header.width, png_header.channels, max_pixels)) {
      item->kind = DecodeKind::kPixels;
    }
    return;
  }
  Header header;
  if (!scan_header(item->data(), &header)) {
    item->note = "not a plain 8-bit JPEG or PNG (Pillow decodes it)";
    return;
  }
  item->format = FileFormat::kJpeg;
  if (!sized(item, header.height, header.width, header.channels, max_pixels)) return;
  item->sampling = header.sampling;
  item->progressive = header.progressive;
  const std::string_view data = item->data();
  const bool complete = data.size() >= 2 && static_cast<uint8_t>(data[data.size() - 2]) == 0xFF &&
                        static_cast<uint8_t>(data[data.size() - 1]) == 0xD9;
  if (mode == ScanMode::kEncoded && complete) {
    item->kind = DecodeKind::kEncoded;
    return;
  }
  if (!library.failure.empty()) {
    item->note = library.failure;
    return;
  }
  Decompression decompression(library);
  failure = decompression.header(data, header);
  if (!failure.empty()) {
    item->note = failure + " (Pillow decides)";
    return;
  }
  if (mode == ScanMode::kCoefficients) {
    failure = decompression.layout(&item->layout, &item->coefficient_bytes);
    if (failure.empty()) {
      item->kind = DecodeKind::kCoefficients;
      return;
    }
    item->note = "GPU JPEG route " + failure + "; decoded whole";
  }
  item->kind = DecodeKind::kPixels;
}

}  // namespace

// ----- the batch -----------------------------------------------------------------------------------------
std::vector<int64_t> ScannedBatch::info() const {
  std::vector<int64_t> rows;
  rows.reserve(items.size() * kInfoFields);
  for (const auto& item : items) {
    rows.insert(rows.end(), {static_cast<int64_t>(item.kind), item.height, item.width, item.channels, item.sampling,
                             item.progressive ? 1 : 0, item.coefficient_bytes,
                             static_cast<int64_t>(item.data().size()), static_cast<int64_t>(item.format)});
  }
  return rows;
}

std::vector<int64_t> ScannedBatch::layouts() const {
  std::vector<int64_t> rows(items.size() * kLayoutFields, 0);
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& layout = items[i].layout;
    std::copy(layout.begin(), layout.begin() + std::min<size_t>(layout.size(), kLayoutFields),
              rows.begin() + i * kLayoutFields);
  }
  return rows;
}

ImageBatchDecoder::ImageBatchDecoder(int threads, std::string library_path)
    : library_path_(std::move(library_path)), pool_(threads) {}

const std::string& ImageBatchDecoder::failure() const { return libjpeg::open_library(library_path_).failure; }

std::shared_ptr<ScannedBatch> ImageBatchDecoder::scan(std::vector<DecodeSource> sources, ScanMode mode,
                                                      int64_t max_pixels, const std::vector<int64_t>& exact) {
  auto batch = std::make_shared<ScannedBatch>();
  batch->items.resize(sources.size());
  std::vector<ScanMode> modes(sources.size(), mode);
  for (const int64_t position : exact) {
    if (position >= 0 && static_cast<size_t>(position) < modes.size()) modes[position] = ScanMode::kCoefficients;
  }
  const libjpeg::Library& library = libjpeg::open_library(library_path_);
  pool_.run(sources.size(), [&](size_t i) {
    try {
      scan_one(library, sources[i], modes[i], max_pixels, &batch->items[i]);
    } catch (const std::exception& error) {  // e.g. out of memory: Pillow decides
      batch->items[i].kind = DecodeKind::kPython;
      batch->items[i].note = error.what();
    }
  });
  return batch;
}

std::vector<std::string> ImageBatchDecoder::decode(const ScannedBatch& batch, uint8_t* pixels, int64_t pixel_capacity,
                                                   const int64_t* pixel_offsets, uint8_t* coefficients,
                                                   int64_t coefficient_capacity, const int64_t* coefficient_offsets,
                                                   bool split_jpegs) {
  const size_t count = batch.items.size();
  std::vector<std::string> failures(count);
  const libjpeg::Library& library = libjpeg::open_library(library_path_);
  auto coefficients_room = [&](const ScannedItem& item, size_t i) {
    const int64_t at = coefficient_offsets[i];
    return at % 16 == 0 && at + item.coefficient_bytes <= coefficient_capacity;
  };
  std::vector<char> written(count, 0);
  std::vector<size_t> few;  // the coefficient items, when few enough to split
  if (split_jpegs && coefficient_offsets != nullptr) {
    for (size_t i = 0; i < count; ++i) {
      const ScannedItem& item = batch.items[i];
      if (item.kind == DecodeKind::kCoefficients && coefficient_offsets[i] >= 0 && coefficients_room(item, i)) {
        few.push_back(i);
      }
    }
    if (few.size() > split_at_most(pool_.threads())) few.clear();
  }
  const entropy_split::ParallelFor parallel_for = [this](size_t tasks, const std::function<void(size_t)>& task) {
    pool_.run(tasks, task);
  };
  for (const size_t i : few) {
    const ScannedItem& item = batch.items[i];
    entropy_split::SplitCounts counts;
    std::string declined;
    try {
      Decompression decompression(library);
      declined = decompression.split_coefficients(item.data(), header_of(item), item.layout,
                                                  coefficients + coefficient_offsets[i],
                                                  coefficient_capacity - coefficient_offsets[i], pool_.threads(),
                                                  parallel_for, &counts);
    } catch (const std::exception& error) {
      declined = error.what();
    }
    written[i] = declined.empty();
    std::lock_guard<std::mutex> lock(totals_lock_);
    totals_.decoded_again += counts.decoded_again;
    if (declined.empty()) {
      ++totals_.split;
      totals_.pieces += counts.pieces;
    } else {
      ++totals_.declined;
      totals_.last_declined = declined;
    }
  }
  // Largest first: the batch ends when its last image does.
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return batch.items[a].data().size() > batch.items[b].data().size();
  });
  pool_.run(count, [&](size_t position) {
    const size_t i = order[position];
    const ScannedItem& item = batch.items[i];
    if (written[i]) return;
    try {
      if (item.kind == DecodeKind::kCoefficients && coefficient_offsets != nullptr && coefficient_offsets[i] >= 0) {
        const int64_t at = coefficient_offsets[i];
        if (!coefficients_room(item, i)) {
          failures[i] = "no room for the coefficients";
        } else {
          Decompression decompression(library);
          failures[i] = decompression.coefficients(item.data(), header_of(item), item.layout, coefficients + at,
                                                   coefficient_capacity - at);
        }
      } else if (item.kind == DecodeKind::kPixels && pixel_offsets != nullptr && pixel_offsets[i] >= 0) {
        const int64_t at = pixel_offsets[i];
        if (at + item.height * item.width * item.channels > pixel_capacity) {
          failures[i] = "no room for the pixels";
        } else if (item.format == FileFormat::kPng) {
          png::Header header{item.height, item.width, item.channels};
          failures[i] = png::decode(item.data(), header, pixels + at);
        } else {
          Decompression decompression(library);
          failures[i] = decompression.pixels(item.data(), header_of(item), pixels + at);
        }
      }
    } catch (const std::exception& error) {
      failures[i] = error.what();
    }
  });
  return failures;
}

ImageBatchDecoder::SplitTotals ImageBatchDecoder::split_totals() const {
  std::lock_guard<std::mutex> lock(totals_lock_);
  return totals_;
}

}  // namespace clip_flash
