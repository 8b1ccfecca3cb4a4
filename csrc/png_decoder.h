// PNG files decoded natively where that gives Pillow's pixels bit for bit: 8-bit grayscale or RGB, not
// interlaced, without a transparency chunk (Pillow opens these in mode L or RGB, and a PNG's pixels are its
// inflated, unfiltered samples: lossless, no colour management at open). Everything else (palette, alpha,
// 16-bit or sub-byte samples, interlacing, animation, chunks Pillow parses its own way, damaged files) is
// declined with the reason, and Pillow decides. zlib is opened at run time (the system's libz.so.1), so
// building needs no zlib development files; without it PNGs stay with Pillow.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace clip_flash {
namespace png {

struct Header {
  int64_t height = 0, width = 0, channels = 0;
};

// Whether `data` starts with the PNG signature.
bool is_png(std::string_view data);

// The checks of a PNG this decoder gives Pillow's pixels for; empty when `data` is one (`header` filled),
// else why not.
std::string scan(std::string_view data, Header* header);

// Decodes a PNG `scan` accepted into `out`: rows of width * channels bytes. Empty when done, else why not
// (then Pillow decides).
std::string decode(std::string_view data, const Header& header, uint8_t* out);

}  // namespace png
}  // namespace clip_flash
