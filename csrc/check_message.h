// check_message(a, b, ...): the pieces of an error message joined into one std::string, for
// TORCH_CHECK(cond, check_message(...)). Numbers formatted through c10::str (an ostringstream, as
// TORCH_CHECK does with several arguments) crash extensions built on one of our toolchains (segmentation
// fault in ostream number formatting), while a message given as a single string does not. Nothing here
// uses ostream: integers go through std::to_string. The text matches what c10::str would write (except
// floating point, which std::to_string writes with 6 decimals).
#pragma once

#include <string>
#include <string_view>
#include <type_traits>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

namespace clip_flash {
namespace check_message_detail {

template <typename T>
struct IsArrayRef : std::false_type {};
template <typename T>
struct IsArrayRef<c10::ArrayRef<T>> : std::true_type {};

template <typename T>
inline constexpr bool kAlwaysFalse = false;

template <typename T>
void append(std::string& out, const T& piece) {
  using U = std::decay_t<T>;
  if constexpr (std::is_same_v<U, bool>) {
    out += piece ? "true" : "false";
  } else if constexpr (std::is_same_v<U, char>) {
    out += piece;
  } else if constexpr (std::is_integral_v<U> || std::is_floating_point_v<U>) {
    out += std::to_string(piece);
  } else if constexpr (std::is_same_v<U, c10::ScalarType>) {
    out += c10::toString(piece);  // "Float", "Half", ...: what operator<< writes
  } else if constexpr (std::is_same_v<U, c10::Device>) {
    out += piece.str();  // "cuda:0": what operator<< writes
  } else if constexpr (IsArrayRef<U>::value) {  // at::IntArrayRef (sizes()): "[2, 3, 4]"
    out += '[';
    for (size_t i = 0; i < piece.size(); ++i) {
      if (i > 0) out += ", ";
      append(out, piece[i]);
    }
    out += ']';
  } else if constexpr (std::is_convertible_v<const T&, std::string_view>) {  // const char*, std::string
    out += std::string_view(piece);
  } else {
    static_assert(kAlwaysFalse<T>, "check_message: no formatting for this type (add one; do not use ostream)");
  }
}

}  // namespace check_message_detail

template <typename... Pieces>
std::string check_message(const Pieces&... pieces) {
  std::string out;
  (check_message_detail::append(out, pieces), ...);
  return out;
}

}  // namespace clip_flash
