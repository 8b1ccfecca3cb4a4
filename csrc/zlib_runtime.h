// zlib, opened at run time (the system's libz.so.1) through the few entry points the PNG decoder uses, with
// zlib's stream structure declared here as zlib.h declares it (its layout has been zlib's ABI since 1.0): the
// extension builds without zlib's development files, as it does without libjpeg's (libjpeg_runtime.h).
#pragma once

#include <dlfcn.h>

#include <mutex>
#include <string>

namespace clip_flash {
namespace zlib {

// zlib.h's z_stream.
struct Stream {
  const unsigned char* next_in;
  unsigned int avail_in;
  unsigned long total_in;
  unsigned char* next_out;
  unsigned int avail_out;
  unsigned long total_out;
  const char* msg;
  void* state;
  void* (*zalloc)(void*, unsigned int, unsigned int);
  void (*zfree)(void*, void*);
  void* opaque;
  int data_type;
  unsigned long adler;
  unsigned long reserved;
};

constexpr int kOk = 0;
constexpr int kStreamEnd = 1;
constexpr int kBufError = -5;
constexpr int kNoFlush = 0;
constexpr const char* kVersion = "1.2.11";  // what inflateInit_ checks: the major version and sizeof(Stream)

struct Library {
  int (*inflate_init)(Stream*, const char*, int) = nullptr;  // inflateInit_
  int (*inflate)(Stream*, int) = nullptr;
  int (*inflate_end)(Stream*) = nullptr;
  unsigned long (*crc32)(unsigned long, const unsigned char*, unsigned int) = nullptr;
  std::string failure;  // why it cannot be used; empty when it can
};

// Opened once for the process's life.
inline const Library& library() {
  static std::once_flag opened;
  static Library* library = new Library();
  std::call_once(opened, [] {
    void* handle = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* why = dlerror();
      library->failure = std::string("zlib unavailable: cannot open libz.so.1") + (why ? std::string(" (") + why + ")" : "");
      return;
    }
    library->inflate_init = reinterpret_cast<decltype(library->inflate_init)>(dlsym(handle, "inflateInit_"));
    library->inflate = reinterpret_cast<decltype(library->inflate)>(dlsym(handle, "inflate"));
    library->inflate_end = reinterpret_cast<decltype(library->inflate_end)>(dlsym(handle, "inflateEnd"));
    library->crc32 = reinterpret_cast<decltype(library->crc32)>(dlsym(handle, "crc32"));
    if (!library->inflate_init || !library->inflate || !library->inflate_end || !library->crc32) {
      library->failure = "zlib unavailable: libz.so.1 lacks inflate or crc32";
    }
  });
  return *library;
}

}  // namespace zlib
}  // namespace clip_flash
