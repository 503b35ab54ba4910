// UTF-8 checks shared by the tokenizers.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>

namespace gale {

// Length of the valid UTF-8 character starting s[0] (1-4), 0 if incomplete, -1 if invalid
// (overlong forms, surrogates and code points past U+10FFFF are invalid).
inline int Utf8CharLength(std::string_view s) {
  if (s.empty()) return 0;
  const auto c = static_cast<uint8_t>(s[0]);
  int len;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) len = 2;
  else if (c >= 0xe0 && c <= 0xef) len = 3;
  else if (c >= 0xf0 && c <= 0xf4) len = 4;
  else return -1;
  for (int i = 1; i < len; ++i) {
    if (i >= static_cast<int>(s.size())) return 0;
    const auto b = static_cast<uint8_t>(s[i]);
    if ((b & 0xc0) != 0x80) return -1;
    // Reject overlong 3/4-byte forms, surrogates and code points past U+10FFFF.
    if (i == 1) {
      if (c == 0xe0 && b < 0xa0) return -1;
      if (c == 0xed && b > 0x9f) return -1;
      if (c == 0xf0 && b < 0x90) return -1;
      if (c == 0xf4 && b > 0x8f) return -1;
    }
  }
  return len;
}

// The code point starting s[0] (s not empty) and its length in bytes. A byte that starts no valid
// character is taken as itself, one byte long; check with Utf8CharLength where that matters.
inline std::pair<uint32_t, int> Utf8Decode(std::string_view s) {
  const int len = Utf8CharLength(s);
  const auto c = static_cast<uint8_t>(s[0]);
  if (len <= 1) return {c, 1};
  uint32_t cp = len == 2 ? (c & 0x1F) : len == 3 ? (c & 0x0F) : (c & 0x07);
  for (int i = 1; i < len; ++i) cp = (cp << 6) | (static_cast<uint8_t>(s[i]) & 0x3F);
  return {cp, len};
}

}  // namespace gale
