// The PNG decoder (png_decoder.h): a whitelist scan of the chunks, then zlib's inflate and the five row filters.
#include "png_decoder.h"

#include <cstdlib>
#include <cstring>
#include <vector>

#include "zlib_runtime.h"

namespace clip_flash {
namespace png {
namespace {

constexpr unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
constexpr size_t kMaxTextChunk = 1 << 20;  // Pillow's MAX_TEXT_CHUNK (ImageFile.SAFEBLOCK)

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

struct Chunk {
  size_t data = 0, length = 0;  // where its data starts in the file, and its length
  char type[5] = {0, 0, 0, 0, 0};
};

bool same(const Chunk& chunk, const char* type) { return std::memcmp(chunk.type, type, 4) == 0; }

// Every chunk from the signature to IEND; empty when well formed. With `verify`, the chunks before the image
// data are checked against their CRCs, as Pillow checks them (it does not check the image data's or IEND's).
std::string read_chunks(std::string_view data, const zlib::Library& z, std::vector<Chunk>* chunks, bool verify) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  size_t at = 8;
  while (true) {
    if (at + 12 > data.size()) return "the file ends before IEND";
    Chunk chunk;
    chunk.length = be32(bytes + at);
    if (chunk.length > 0x7FFFFFFFu || at + 12 + chunk.length > data.size()) return "a chunk runs past the file";
    std::memcpy(chunk.type, bytes + at + 4, 4);
    for (int i = 0; i < 4; ++i) {
      const char c = chunk.type[i];
      if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'))) return "a chunk type that is not four letters";
    }
    chunk.data = at + 8;
    if (same(chunk, "IDAT")) verify = false;
    if (verify) {
      const unsigned long crc = z.crc32(z.crc32(0, nullptr, 0), bytes + at + 4,
                                        static_cast<unsigned int>(chunk.length + 4));
      if (crc != be32(bytes + chunk.data + chunk.length)) return std::string("bad CRC in ") + chunk.type;
    }
    chunks->push_back(chunk);
    if (same(chunk, "IEND")) return "";
    at += 12 + chunk.length;
  }
}

// An iCCP chunk Pillow reads without error: a name, compression method 0, a profile inflating completely to at
// most MAX_TEXT_CHUNK bytes.
bool plain_icc_profile(const unsigned char* chunk, size_t length, const zlib::Library& z) {
  const void* nul = std::memchr(chunk, 0, length);
  if (nul == nullptr) return false;
  const size_t name = static_cast<const unsigned char*>(nul) - chunk;
  if (name + 2 > length || chunk[name + 1] != 0) return false;
  zlib::Stream stream;
  std::memset(&stream, 0, sizeof(stream));
  if (z.inflate_init(&stream, zlib::kVersion, static_cast<int>(sizeof(stream))) != zlib::kOk) return false;
  std::vector<unsigned char> out(kMaxTextChunk + 1);
  stream.next_in = chunk + name + 2;
  stream.avail_in = static_cast<unsigned int>(length - name - 2);
  stream.next_out = out.data();
  stream.avail_out = static_cast<unsigned int>(out.size());
  const int status = z.inflate(&stream, zlib::kNoFlush);
  const bool whole = status == zlib::kStreamEnd && stream.total_out <= kMaxTextChunk;
  z.inflate_end(&stream);
  return whole;
}

// Why an ancillary chunk before the image data could make Pillow read the file otherwise (or fail); empty:
// Pillow reads past it. Chunks Pillow does not know it skips.
std::string ancillary_refusal(const Chunk& chunk, std::string_view data, const zlib::Library& z) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data()) + chunk.data;
  if (same(chunk, "tRNS")) return "a transparency chunk";
  if (same(chunk, "acTL") || same(chunk, "fcTL") || same(chunk, "fdAT")) return "an animated PNG";
  if (same(chunk, "zTXt") || same(chunk, "iTXt")) return "compressed text";
  if (same(chunk, "tEXt") && chunk.length > kMaxTextChunk) return "a text chunk past Pillow's text limit";
  if (same(chunk, "gAMA") && chunk.length < 4) return "a short gAMA chunk";
  if (same(chunk, "cHRM") && chunk.length < 32) return "a short cHRM chunk";
  if (same(chunk, "sRGB") && chunk.length < 1) return "a short sRGB chunk";
  if (same(chunk, "pHYs") && chunk.length < 9) return "a short pHYs chunk";
  if (same(chunk, "iCCP") && !plain_icc_profile(bytes, chunk.length, z)) return "an ICC profile Pillow may refuse";
  return "";
}

int paeth(int a, int b, int c) {
  const int p = a + b - c, pa = std::abs(p - a), pb = std::abs(p - b), pc = std::abs(p - c);
  if (pa <= pb && pa <= pc) return a;
  return pb <= pc ? b : c;
}

// Reverses row filter `filter` on `row` (in place), `previous` being the row above reconstructed (or null).
bool unfilter(int filter, unsigned char* row, const unsigned char* previous, size_t length, size_t step) {
  switch (filter) {
    case 0:
      return true;
    case 1:
      for (size_t i = step; i < length; ++i) row[i] = static_cast<unsigned char>(row[i] + row[i - step]);
      return true;
    case 2:
      if (previous != nullptr) {
        for (size_t i = 0; i < length; ++i) row[i] = static_cast<unsigned char>(row[i] + previous[i]);
      }
      return true;
    case 3:
      for (size_t i = 0; i < length; ++i) {
        const int left = i >= step ? row[i - step] : 0, up = previous != nullptr ? previous[i] : 0;
        row[i] = static_cast<unsigned char>(row[i] + ((left + up) >> 1));
      }
      return true;
    case 4:
      for (size_t i = 0; i < length; ++i) {
        const int left = i >= step ? row[i - step] : 0, up = previous != nullptr ? previous[i] : 0;
        const int corner = i >= step && previous != nullptr ? previous[i - step] : 0;
        row[i] = static_cast<unsigned char>(row[i] + paeth(left, up, corner));
      }
      return true;
    default:
      return false;
  }
}

}  // namespace

bool is_png(std::string_view data) {
  return data.size() >= 8 && std::memcmp(data.data(), kSignature, 8) == 0;
}

std::string scan(std::string_view data, Header* header) {
  const zlib::Library& z = zlib::library();
  if (!z.failure.empty()) return z.failure;
  std::vector<Chunk> chunks;
  std::string failure = read_chunks(data, z, &chunks, true);
  if (!failure.empty()) return failure;
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  const Chunk& first = chunks.front();
  if (!same(first, "IHDR") || first.length < 13) return "no image header first";
  const unsigned char* ihdr = bytes + first.data;
  const uint32_t width = be32(ihdr), height = be32(ihdr + 4);
  const int depth = ihdr[8], colour = ihdr[9], compression = ihdr[10], filter = ihdr[11], interlace = ihdr[12];
  if (width == 0 || height == 0 || width > 0x7FFFFFFFu || height > 0x7FFFFFFFu) return "a zero or huge size";
  if (depth != 8 || (colour != 0 && colour != 2)) return "not 8-bit grayscale or RGB";
  if (compression != 0 || filter != 0) return "an unknown compression or filter method";
  if (interlace != 0) return "interlaced";
  if (uint64_t(width) * (colour == 2 ? 3 : 1) >= (uint64_t(1) << 31)) return "a row past 2 GiB";  // zlib's counts
  bool in_image = false, after_image = false;
  for (size_t i = 1; i < chunks.size(); ++i) {
    const Chunk& chunk = chunks[i];
    if (same(chunk, "IEND")) break;
    if (same(chunk, "IDAT")) {
      if (after_image) return "image data in more than one run";
      in_image = true;
      continue;
    }
    if (in_image) after_image = true;
    if (after_image) return std::string("a chunk after the image data: ") + chunk.type;  // Pillow reads these too
    if (same(chunk, "PLTE")) continue;  // a suggested palette of an RGB image: Pillow ignores it
    if (chunk.type[0] >= 'A' && chunk.type[0] <= 'Z') return std::string("an unknown critical chunk: ") + chunk.type;
    failure = ancillary_refusal(chunk, data, z);
    if (!failure.empty()) return failure;
  }
  if (!in_image) return "no image data";
  header->height = height;
  header->width = width;
  header->channels = colour == 2 ? 3 : 1;
  return "";
}

std::string decode(std::string_view data, const Header& header, uint8_t* out) {
  const zlib::Library& z = zlib::library();
  if (!z.failure.empty()) return z.failure;
  std::vector<Chunk> chunks;
  std::string failure = read_chunks(data, z, &chunks, false);  // the scan checked them
  if (!failure.empty()) return failure;
  std::vector<const Chunk*> image;
  for (const Chunk& chunk : chunks) {
    if (same(chunk, "IDAT")) image.push_back(&chunk);
  }
  const auto* bytes = reinterpret_cast<const unsigned char*>(data.data());
  const size_t step = static_cast<size_t>(header.channels);
  const size_t row_bytes = static_cast<size_t>(header.width) * step;
  zlib::Stream stream;
  std::memset(&stream, 0, sizeof(stream));
  if (z.inflate_init(&stream, zlib::kVersion, static_cast<int>(sizeof(stream))) != zlib::kOk) {
    return "zlib could not start";
  }
  size_t next_chunk = 0;
  int status = zlib::kOk;
  // The next non-empty IDAT chunk as input, once the current one is used up.
  auto feed = [&]() {
    while (stream.avail_in == 0 && next_chunk < image.size()) {
      stream.next_in = bytes + image[next_chunk]->data;
      stream.avail_in = static_cast<unsigned int>(image[next_chunk]->length);
      ++next_chunk;
    }
  };
  // Inflates exactly `count` bytes into `target`; empty when done, else why not.
  auto fill = [&](unsigned char* target, size_t count) -> std::string {
    stream.next_out = target;
    stream.avail_out = static_cast<unsigned int>(count);
    while (stream.avail_out > 0) {
      if (status == zlib::kStreamEnd) return "the image data ends early";
      feed();
      status = z.inflate(&stream, zlib::kNoFlush);
      if (status == zlib::kBufError) {  // no progress: zlib needs input there is none of
        if (stream.avail_in == 0 && next_chunk >= image.size()) return "the image data is not complete";
        continue;
      }
      if (status != zlib::kOk && status != zlib::kStreamEnd) {
        return std::string("zlib: ") + (stream.msg ? stream.msg : "inflate failed");
      }
    }
    return "";
  };
  unsigned char filter = 0;
  for (int64_t y = 0; y < header.height && failure.empty(); ++y) {
    // Each row is its filter byte, then its samples, inflated straight into place and unfiltered there.
    unsigned char* row = out + static_cast<size_t>(y) * row_bytes;
    failure = fill(&filter, 1);
    if (failure.empty()) failure = fill(row, row_bytes);
    if (failure.empty() && !unfilter(filter, row, y > 0 ? row - row_bytes : nullptr, row_bytes, step)) {
      failure = "an unknown row filter";
    }
  }
  if (failure.empty() && status != zlib::kStreamEnd) {  // the stream must end where the image does
    unsigned char extra;
    const std::string beyond = fill(&extra, 1);
    if (beyond.empty()) failure = "more image data than the image holds";
    else if (status != zlib::kStreamEnd) failure = beyond;
  }
  if (failure.empty()) {
    feed();
    if (stream.avail_in != 0) failure = "data after the image data's end";
  }
  z.inflate_end(&stream);
  return failure;
}

}  // namespace png
}  // namespace clip_flash
