// One baseline JPEG's entropy decode split across threads: the same DCT coefficients libjpeg-turbo's
// jpeg_read_coefficients gives, for a single request's latency rather than a batch's throughput.
//
// A baseline scan has no restart markers to cut it at, but Huffman codes resynchronise: a decode started at an
// arbitrary bit soon falls onto the true codeword and block boundaries. The scan's bits are cut into pieces;
// each piece is decoded by its own thread from a little before its start, and is kept from its first MCU
// boundary at or past its start. The cuts are then checked in order: a piece counts only where it begins
// exactly where its predecessor's true decode ended (the first MCU boundary past the cut); one that does not is
// decoded again from there, so the result never rests on a guess. The DC predictions are summed across pieces
// and every block is written to its place. Anything this decoder does not handle exactly as libjpeg-turbo does
// (restart intervals, progressive or arithmetic coding, several scans, a code no table holds, data ending early
// or bytes left after the scan, a marker but EOI after it) is declined, and the caller decodes with libjpeg.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace clip_flash {
namespace entropy_split {

// A Huffman table as the DHT segment gives it: bits[l] codes of length l (1..16), then the symbols.
struct HuffmanSpec {
  uint8_t bits[17] = {};
  uint8_t values[256] = {};
};

// A component of the scan, in scan order.
struct ScanComponent {
  int across = 1, down = 1;                      // its blocks in an MCU (sampling factors; 1x1 non-interleaved)
  int64_t width_in_blocks = 0, height_in_blocks = 0;
  int16_t* blocks = nullptr;                     // its first block (rows of width_in_blocks blocks, 64 each)
  const HuffmanSpec* dc = nullptr;
  const HuffmanSpec* ac = nullptr;
};

struct Scan {
  const uint8_t* data = nullptr;  // the entropy-coded data, and whatever follows it to the end of the file
  size_t size = 0;
  std::vector<ScanComponent> components;
  int64_t mcus_across = 0, mcus_down = 0;
};

// Runs task(i) for i in [0, count), in parallel; returns when all are done.
using ParallelFor = std::function<void(size_t count, const std::function<void(size_t)>& task)>;

// What one decode did: pieces cut, and pieces whose guessed start did not meet the true decode (decoded again).
struct SplitCounts {
  int pieces = 0;
  int decoded_again = 0;
};

// Decodes `scan` in up to `pieces` pieces (fewer for a short scan) and writes every block. Empty: written,
// exactly as libjpeg-turbo would; otherwise why not (the blocks may be partly written; decode with libjpeg).
std::string decode(const Scan& scan, int pieces, const ParallelFor& parallel_for, SplitCounts* counts = nullptr);

}  // namespace entropy_split
}  // namespace clip_flash
