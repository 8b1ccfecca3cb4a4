// One baseline JPEG's entropy decode split across threads (jpeg_entropy_split.h). The arithmetic is libjpeg-turbo's
// (jdhuff.c): its canonical Huffman decode, HUFF_EXTEND, the run/size loop with its extended natural order, DC
// predictions summed in int and stored as JCOEF; its table checks are repeated so that a table libjpeg refuses
// is declined here.
#include "jpeg_entropy_split.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <exception>
#include <memory>

namespace clip_flash {
namespace entropy_split {
namespace {

constexpr int kLookBits = 9;
constexpr int kMaxBlocksInMcu = 10;  // D_MAX_BLOCKS_IN_MCU
constexpr int kMaxComponents = 4;
// Zeros after the scan's bytes: an MCU decoded from anywhere before the end reads at most 10 blocks of 64
// 31-bit codes (about 2.5 kB) past where it starts.
constexpr size_t kPadBytes = 4096;
// A piece is at least this many bits, and its decode starts this many bits before its cut (a guess, checked: a
// piece whose guess has not settled onto the true decode by its cut is decoded again from the true start).
constexpr size_t kMinPieceBits = 32768;
constexpr size_t kLeadBits = 12288;

// jpeg_natural_order, with libjpeg's 16 extra entries: a run past the last coefficient lands on it.
constexpr uint8_t kNaturalOrder[64 + 16] = {
    0,  1,  8,  16, 9,  2,  3,  10, 17, 24, 32, 25, 18, 11, 4,  5,  12, 19, 26, 33, 40, 48, 41, 34, 27, 20, 13,
    6,  7,  14, 21, 28, 35, 42, 49, 56, 57, 50, 43, 36, 29, 22, 15, 23, 30, 37, 44, 51, 58, 59, 52, 45, 38, 31,
    39, 46, 53, 60, 61, 54, 47, 55, 62, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63, 63};

struct Table {
  uint16_t look[1 << kLookBits];  // (length << 8) | symbol for codes of at most kLookBits bits; 0: longer
  int32_t maxcode[18];
  int32_t valoffset[18];
  uint8_t values[256];
};

// jpeg_make_d_derived_tbl: false where libjpeg stops with "Bogus Huffman table definition".
bool build_table(const HuffmanSpec& spec, bool dc, Table* table) {
  int sizes[257];
  int32_t codes[257];
  int count = 0;
  for (int length = 1; length <= 16; ++length) {
    const int here = spec.bits[length];
    if (count + here > 256) return false;
    for (int i = 0; i < here; ++i) sizes[count++] = length;
  }
  sizes[count] = 0;
  int32_t code = 0;
  int size = sizes[0];
  for (int p = 0; sizes[p] != 0;) {
    while (sizes[p] == size) codes[p++] = code++;
    if (code >= (int32_t{1} << size)) return false;
    code <<= 1;
    ++size;
  }
  for (int length = 1, p = 0; length <= 16; ++length) {
    if (spec.bits[length] != 0) {
      table->valoffset[length] = p - codes[p];
      p += spec.bits[length];
      table->maxcode[length] = codes[p - 1];
    } else {
      table->maxcode[length] = -1;
      table->valoffset[length] = 0;
    }
  }
  table->maxcode[17] = 0xFFFFF;
  table->valoffset[17] = 0;
  for (int i = 0; i < count; ++i) {
    if (dc && spec.values[i] > 15) return false;
  }
  std::memcpy(table->values, spec.values, sizeof(table->values));
  // The lookahead gives what the bit-by-bit search below gives, for the codes it holds.
  for (int look = 0; look < (1 << kLookBits); ++look) {
    table->look[look] = 0;
    for (int length = 1; length <= kLookBits; ++length) {
      const int32_t prefix = look >> (kLookBits - length);
      if (prefix <= table->maxcode[length]) {
        table->look[look] = static_cast<uint16_t>((length << 8) | table->values[prefix + table->valoffset[length]]);
        break;
      }
    }
  }
  return true;
}

// 64 bits of the stream from `bit` on, most significant first (at least 57 of them meaningful).
inline uint64_t peek(const uint8_t* stream, size_t bit) {
  uint64_t word;
  std::memcpy(&word, stream + (bit >> 3), sizeof(word));
  return __builtin_bswap64(word) << (bit & 7);
}

// The symbol whose code starts `window`; false for a code the table does not hold (libjpeg warns, "Corrupt JPEG
// data: bad Huffman code").
inline bool symbol(const Table& table, uint64_t window, int* length, int* value) {
  const uint16_t entry = table.look[window >> (64 - kLookBits)];
  if (entry != 0) {
    *length = entry >> 8;
    *value = entry & 0xFF;
    return true;
  }
  const uint32_t top = static_cast<uint32_t>(window >> 48);
  for (int bits = kLookBits + 1; bits <= 16; ++bits) {
    const int32_t code = static_cast<int32_t>(top >> (16 - bits));
    if (code <= table.maxcode[bits]) {
      *length = bits;
      *value = table.values[code + table.valoffset[bits]];
      return true;
    }
  }
  return false;
}

// HUFF_EXTEND: `size` raw bits as a signed value.
inline int32_t extend(uint32_t bits, int size) {
  return bits < (uint32_t{1} << (size - 1)) ? static_cast<int32_t>(bits) - (int32_t{1} << size) + 1
                                             : static_cast<int32_t>(bits);
}

struct Decoder {
  const uint8_t* stream = nullptr;  // the scan's bytes without stuffing, then kPadBytes zeros
  size_t total_bits = 0;
  int blocks = 0;  // in an MCU
  const Table* dc[kMaxBlocksInMcu] = {};
  const Table* ac[kMaxBlocksInMcu] = {};
  int component[kMaxBlocksInMcu] = {};
};

// One cut of the scan: decoded MCUs kept from its first MCU boundary at or past `cut` to the first at or past
// `next_cut` (the last piece: to the end of the data).
struct Piece {
  size_t cut = 0, next_cut = 0;
  size_t first = 0;  // where its kept MCUs start
  size_t exit = 0;   // where they end: the next piece's first, when both lie on the true decode
  bool complete = false;  // reached next_cut without a bad code or running out of data
  bool failed = false;    // an exception (out of memory)
  std::vector<size_t> mcu_end;    // the bit after each kept MCU (one entry per kept MCU)
  std::vector<int32_t> dc;        // each kept block's DC difference
  std::vector<uint8_t> ac_count;  // each kept block's AC coefficients written
  std::vector<uint32_t> ac;       // (natural position << 16) | the value's 16 bits
  int64_t dc_sum[kMaxComponents] = {};
};

template <bool kKeep>
inline bool decode_mcu(const Decoder& decoder, size_t* bit, Piece* piece) {
  size_t at = *bit;
  for (int block = 0; block < decoder.blocks; ++block) {
    uint64_t window = peek(decoder.stream, at);
    int length, size;
    if (!symbol(*decoder.dc[block], window, &length, &size)) return false;
    int32_t difference = 0;
    if (size != 0) difference = extend(static_cast<uint32_t>((window << length) >> (64 - size)), size);
    at += length + size;
    int written = 0;
    const Table& ac = *decoder.ac[block];
    for (int k = 1; k < 64; ++k) {
      window = peek(decoder.stream, at);
      int run_size;
      if (!symbol(ac, window, &length, &run_size)) return false;
      const int run = run_size >> 4, bits = run_size & 15;
      if (bits != 0) {
        k += run;
        const int32_t value = extend(static_cast<uint32_t>((window << length) >> (64 - bits)), bits);
        at += length + bits;
        if (kKeep) {
          piece->ac.push_back((uint32_t{kNaturalOrder[k]} << 16) | static_cast<uint16_t>(static_cast<int16_t>(value)));
          ++written;
        }
      } else {
        at += length;
        if (run != 15) break;
        k += 15;
      }
    }
    if (kKeep) {
      piece->dc.push_back(difference);
      piece->ac_count.push_back(static_cast<uint8_t>(written));
    }
  }
  *bit = at;
  return true;
}

// Decodes from `bit` (a guess unless it is an MCU boundary of the true decode) as the piece says; see Piece.
void decode_piece(const Decoder& decoder, Piece* piece, size_t bit, bool last) {
  piece->complete = false;
  piece->mcu_end.clear();
  piece->dc.clear();
  piece->ac_count.clear();
  piece->ac.clear();
  std::fill(std::begin(piece->dc_sum), std::end(piece->dc_sum), 0);
  const size_t span = piece->next_cut - piece->cut + kLeadBits;
  piece->dc.reserve(span / 16);
  piece->ac_count.reserve(span / 16);
  piece->ac.reserve(span / 4);
  while (bit < piece->cut) {  // not kept: a guessed start settling onto the true codes
    size_t at = bit;
    if (decode_mcu<false>(decoder, &at, nullptr)) {
      bit = at;
    } else {
      ++bit;  // not on a code boundary: guess again one bit on
    }
  }
  piece->first = bit;
  const size_t end = last ? decoder.total_bits : piece->next_cut;
  while (bit < end) {
    size_t at = bit;
    const size_t blocks = piece->dc.size(), entries = piece->ac.size();
    if (!decode_mcu<true>(decoder, &at, piece) || at > decoder.total_bits) {
      piece->dc.resize(blocks);
      piece->ac_count.resize(blocks);
      piece->ac.resize(entries);
      break;
    }
    bit = at;
    piece->mcu_end.push_back(bit);
  }
  piece->exit = bit;
  piece->complete = bit >= end;
  for (size_t block = 0; block < piece->dc.size(); ++block) {
    piece->dc_sum[decoder.component[block % decoder.blocks]] += piece->dc[block];
  }
}

// The entropy-coded bytes without their stuffing, up to the marker that ends them, which must be EOI right
// after them; then kPadBytes zeros. Empty string: done.
std::string unstuff(const uint8_t* data, size_t size, std::unique_ptr<uint8_t[]>* stream, size_t* bytes) {
  stream->reset(new uint8_t[size + kPadBytes]);
  uint8_t* out = stream->get();
  size_t written = 0, at = 0;
  while (true) {
    const void* found = at < size ? std::memchr(data + at, 0xFF, size - at) : nullptr;
    if (found == nullptr) return "the data ends without EOI";
    const size_t marker = static_cast<const uint8_t*>(found) - data;
    std::memcpy(out + written, data + at, marker - at);
    written += marker - at;
    if (marker + 1 >= size) return "the data ends inside a marker";
    if (data[marker + 1] == 0x00) {  // a stuffed 0xFF data byte
      out[written++] = 0xFF;
      at = marker + 2;
      continue;
    }
    // Fill bytes, restart markers, or any marker but EOI: left to libjpeg.
    if (data[marker + 1] != 0xD9) return "a marker other than EOI ends the scan";
    break;
  }
  std::memset(out + written, 0, kPadBytes);
  *bytes = written;
  return "";
}

}  // namespace

std::string decode(const Scan& scan, int pieces, const ParallelFor& parallel_for, SplitCounts* counts) {
  const int components = static_cast<int>(scan.components.size());
  if (components < 1 || components > kMaxComponents) return "components in the scan: " + std::to_string(components);
  if (scan.mcus_across <= 0 || scan.mcus_down <= 0) return "an empty scan";
  Decoder decoder;
  std::vector<std::unique_ptr<Table>> tables;
  std::vector<std::pair<const HuffmanSpec*, bool>> built;
  auto table_of = [&](const HuffmanSpec* spec, bool dc) -> const Table* {
    for (size_t i = 0; i < built.size(); ++i) {
      if (built[i].first == spec && built[i].second == dc) return tables[i].get();
    }
    std::unique_ptr<Table> table(new Table);
    if (spec == nullptr || !build_table(*spec, dc, table.get())) return nullptr;
    built.emplace_back(spec, dc);
    tables.push_back(std::move(table));
    return tables.back().get();
  };
  for (int c = 0; c < components; ++c) {
    const ScanComponent& component = scan.components[c];
    if (component.across < 1 || component.down < 1 || component.blocks == nullptr) return "a bad component";
    const Table* dc = table_of(component.dc, true);
    const Table* ac = table_of(component.ac, false);
    if (dc == nullptr || ac == nullptr) return "a missing or bad Huffman table";
    for (int i = 0; i < component.across * component.down; ++i) {
      if (decoder.blocks == kMaxBlocksInMcu) return "more than 10 blocks in an MCU";
      decoder.dc[decoder.blocks] = dc;
      decoder.ac[decoder.blocks] = ac;
      decoder.component[decoder.blocks++] = c;
    }
  }
  std::unique_ptr<uint8_t[]> stream;
  size_t bytes = 0;
  std::string failure = unstuff(scan.data, scan.size, &stream, &bytes);
  if (!failure.empty()) return failure;
  decoder.stream = stream.get();
  decoder.total_bits = bytes * 8;
  const int count = static_cast<int>(std::min<size_t>(std::max(pieces, 1), decoder.total_bits / kMinPieceBits));
  if (count < 2) return "too short to split";
  const int64_t mcus = scan.mcus_across * scan.mcus_down;

  std::vector<Piece> cut(count);
  for (int i = 0; i < count; ++i) {
    cut[i].cut = decoder.total_bits * i / count;
    cut[i].next_cut = decoder.total_bits * (i + 1) / count;
  }
  parallel_for(count, [&](size_t i) {
    Piece& piece = cut[i];
    try {
      decode_piece(decoder, &piece, i == 0 ? 0 : piece.cut - std::min(piece.cut, kLeadBits), i + 1 == cut.size());
    } catch (const std::exception&) {
      piece.failed = true;
    }
  });

  // In order: each piece from where the previous one's true decode ended (decoded again where its guess missed).
  std::vector<int64_t> first_mcu(count, 0);
  int used = 0;
  size_t end_bit = 0;
  int64_t done = 0;
  for (int i = 0; i < count; ++i) {
    Piece& piece = cut[i];
    if (i > 0 && (piece.failed || piece.first != cut[i - 1].exit)) {
      piece.failed = false;
      decode_piece(decoder, &piece, cut[i - 1].exit, i + 1 == count);
      if (counts != nullptr) ++counts->decoded_again;
    }
    if (piece.failed) return "out of memory";
    first_mcu[i] = done;
    const int64_t kept = static_cast<int64_t>(piece.mcu_end.size());
    if (done + kept >= mcus) {
      const int64_t keep = mcus - done;
      piece.mcu_end.resize(keep);
      end_bit = keep > 0 ? piece.mcu_end[keep - 1] : piece.first;
      used = i + 1;
      break;
    }
    if (!piece.complete) return "the data ends early or holds a code no table has";
    done += kept;
  }
  if (used == 0) return "fewer MCUs in the data than the frame has";
  if (decoder.total_bits - end_bit >= 8) return "bytes left after the scan's last MCU";
  if (counts != nullptr) counts->pieces = count;

  // Each piece's DC predictions start where the pieces before it left them.
  std::vector<int64_t> start(static_cast<size_t>(used) * kMaxComponents, 0);
  for (int i = 1; i < used; ++i) {
    for (int c = 0; c < components; ++c) {
      start[i * kMaxComponents + c] = start[(i - 1) * kMaxComponents + c] + cut[i - 1].dc_sum[c];
    }
  }
  std::vector<char> overflowed(used, 0);
  parallel_for(used, [&](size_t i) {
    const Piece& piece = cut[i];
    int64_t predicted[kMaxComponents];
    std::copy(start.begin() + i * kMaxComponents, start.begin() + (i + 1) * kMaxComponents, predicted);
    size_t block = 0, entry = 0;
    for (size_t n = 0; n < piece.mcu_end.size(); ++n) {
      const int64_t mcu = first_mcu[i] + static_cast<int64_t>(n);
      const int64_t row = mcu / scan.mcus_across, column = mcu % scan.mcus_across;
      for (int c = 0; c < components; ++c) {
        const ScanComponent& component = scan.components[c];
        for (int y = 0; y < component.down; ++y) {
          for (int x = 0; x < component.across; ++x, ++block) {
            predicted[c] += piece.dc[block];
            // libjpeg stops with "Corrupt JPEG data: bad DCT coefficient" where its int would overflow.
            if (predicted[c] > INT_MAX || predicted[c] < INT_MIN) overflowed[i] = 1;
            const int written = piece.ac_count[block];
            const int64_t down = row * component.down + y, across = column * component.across + x;
            if (down < component.height_in_blocks && across < component.width_in_blocks) {
              int16_t* out = component.blocks + (down * component.width_in_blocks + across) * 64;
              std::memset(out, 0, 64 * sizeof(int16_t));
              out[0] = static_cast<int16_t>(static_cast<int32_t>(predicted[c]));
              for (int e = 0; e < written; ++e) {
                const uint32_t value = piece.ac[entry + e];
                out[value >> 16] = static_cast<int16_t>(value & 0xFFFF);
              }
            }  // else a block past the image's edge, decoded and not stored
            entry += written;
          }
        }
      }
    }
  });
  if (std::find(overflowed.begin(), overflowed.end(), 1) != overflowed.end()) return "a DC value past int";
  return "";
}

}  // namespace entropy_split
}  // namespace clip_flash
