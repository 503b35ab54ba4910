// GPT-2 pre-tokenizer as a hand-written scanner (std::regex has no \p{..}); character classes
// from utf8proc's Unicode categories, white space as Unicode's White_Space property.
#include "model/bpe.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdlib>
#include <functional>

#include <utf8proc.h>

#include "base/utf8.h"

namespace gale {
namespace {

bool IsWhitespace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

bool IsLetter(uint32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool IsNumber(uint32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}

struct ByteTables {
  std::array<std::string, 256> byte_to_char;
  std::array<int, 324> char_to_byte;  // code points used are < 324
};

const ByteTables& Tables() {
  static const ByteTables t = [] {
    ByteTables t;
    t.char_to_byte.fill(-1);
    int extra = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae && b <= 0xff);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + extra++);
      utf8proc_uint8_t buf[4];
      const auto len = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
      t.byte_to_char[b].assign(reinterpret_cast<const char*>(buf), static_cast<size_t>(len));
      t.char_to_byte[cp] = b;
    }
    return t;
  }();
  return t;
}

bool IsPunctuation(uint32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

// The code points of text and the byte offset of each, plus one final offset (the end).
void DecodeAll(std::string_view text, std::vector<uint32_t>* cps, std::vector<size_t>* offsets) {
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const int len = DecodeUtf8(text.substr(i), &cp);
    cps->push_back(cp);
    offsets->push_back(i);
    i += static_cast<size_t>(len);
  }
  offsets->push_back(text.size());
}

// Cuts text into the spans where match(cp_index) says a match of length > 0 starts and the gaps.
template <typename MatchFn>
std::vector<std::string_view> SplitByMatches(std::string_view text, MatchFn match) {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;
  DecodeAll(text, &cps, &offsets);
  std::vector<std::string_view> out;
  size_t gap_start = 0;
  for (size_t i = 0; i < cps.size();) {
    const size_t len = match(cps, i);
    if (len == 0) {
      ++i;
      continue;
    }
    if (gap_start < i) out.push_back(text.substr(offsets[gap_start], offsets[i] - offsets[gap_start]));
    out.push_back(text.substr(offsets[i], offsets[i + len] - offsets[i]));
    i += len;
    gap_start = i;
  }
  if (gap_start < cps.size()) out.push_back(text.substr(offsets[gap_start]));
  return out;
}

}  // namespace

std::vector<std::string_view> SplitPunctuationRuns(std::string_view text, bool with_backtick) {
  auto is_member = [with_backtick](uint32_t c) {
    return IsPunctuation(c) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '~' ||
           c == '|' || (c == '`' && with_backtick);
  };
  return SplitByMatches(text, [&](const std::vector<uint32_t>& cps, size_t i) {
    size_t j = i;
    while (j < cps.size() && is_member(cps[j])) ++j;
    return j - i;
  });
}

std::vector<std::string_view> SplitNumberRuns(std::string_view text) {
  return SplitByMatches(text, [](const std::vector<uint32_t>& cps, size_t i) {
    size_t j = i;
    while (j < cps.size() && IsNumber(cps[j])) ++j;
    return j - i;
  });
}

std::vector<std::string_view> SplitDigitTriples(std::string_view text) {
  auto digit = [](uint32_t c) { return c >= '0' && c <= '9'; };
  return SplitByMatches(text, [&](const std::vector<uint32_t>& cps, size_t i) -> size_t {
    return i + 2 < cps.size() && digit(cps[i]) && digit(cps[i + 1]) && digit(cps[i + 2]) ? 3 : 0;
  });
}

bool IsUnicodeNumber(uint32_t code_point) { return IsNumber(code_point); }

namespace {

using Cps = std::vector<uint32_t>;
using Pass = std::function<size_t(const Cps&, size_t)>;

// \s?X+ : an optional white-space character, then a run of X.
template <typename IsX>
Pass OptionalSpaceRun(IsX is_x) {
  return [is_x](const Cps& cps, size_t i) -> size_t {
    size_t j = i;
    if (IsWhitespace(cps[j]) && j + 1 < cps.size() && is_x(cps[j + 1])) ++j;
    if (!is_x(cps[j])) return 0;
    while (j < cps.size() && is_x(cps[j])) ++j;
    return j - i;
  };
}

template <typename IsX>
Pass Run(IsX is_x) {
  return [is_x](const Cps& cps, size_t i) -> size_t {
    size_t j = i;
    while (j < cps.size() && is_x(cps[j])) ++j;
    return j - i;
  };
}

Pass LineBreak() {
  return [](const Cps& cps, size_t i) -> size_t { return cps[i] == '\r' || cps[i] == '\n' ? 1 : 0; };
}

bool IsCjk(uint32_t c) { return (c >= 0x0800 && c <= 0x9fa5) || (c >= 0xac00 && c <= 0xd7ff); }

// llama.cpp applies a pre-tokenizer's expressions one after another: each splits every piece
// the previous ones produced into its matches and the text between them.
std::vector<std::string_view> ApplyPasses(std::string_view text, const std::vector<Pass>& passes) {
  std::vector<std::string_view> pieces = {text};
  for (const auto& pass : passes) {
    std::vector<std::string_view> next;
    for (std::string_view p : pieces) {
      for (std::string_view q : SplitByMatches(p, pass)) next.push_back(q);
    }
    pieces = std::move(next);
  }
  return pieces;
}

// A regex character class written as its characters and ranges ("A-Za-zµ..."), as sorted
// code point ranges.
std::vector<std::pair<uint32_t, uint32_t>> ParseClass(std::string_view cls) {
  Cps cps;
  std::vector<size_t> offsets;
  DecodeAll(cls, &cps, &offsets);
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (i + 2 < cps.size() && cps[i + 1] == '-') {
      ranges.emplace_back(cps[i], cps[i + 2]);
      i += 2;
    } else {
      ranges.emplace_back(cps[i], cps[i]);
    }
  }
  std::sort(ranges.begin(), ranges.end());
  // Overlapping ranges merged, so that InRanges' search by start finds the one that holds c.
  std::vector<std::pair<uint32_t, uint32_t>> merged;
  for (const auto& r : ranges) {
    if (!merged.empty() && r.first <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, r.second);
    } else {
      merged.push_back(r);
    }
  }
  return merged;
}

bool InRanges(const std::vector<std::pair<uint32_t, uint32_t>>& ranges, uint32_t c) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), std::make_pair(c, UINT32_MAX));
  return it != ranges.begin() && std::prev(it)->second >= c;
}

}  // namespace

namespace {

using utf8proc_cat = utf8proc_category_t;
utf8proc_cat Cat(uint32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)); }
bool IsMark(uint32_t c) {
  const auto k = Cat(c);
  return k == UTF8PROC_CATEGORY_MN || k == UTF8PROC_CATEGORY_MC || k == UTF8PROC_CATEGORY_ME;
}
bool IsSymbol(uint32_t c) {
  const auto k = Cat(c);
  return k == UTF8PROC_CATEGORY_SM || k == UTF8PROC_CATEGORY_SC || k == UTF8PROC_CATEGORY_SK || k == UTF8PROC_CATEGORY_SO;
}
bool IsLineBreak(uint32_t c) { return c == '\r' || c == '\n'; }

// (?i:'s|'t|'re|'ve|'m|'ll|'d) at i: its length, or 0.
size_t Contraction(const Cps& c, size_t i) {
  if (i + 1 >= c.size() || c[i] != '\'') return 0;
  auto low = [&](size_t k) { return k < c.size() && c[k] < 128 ? static_cast<char>(std::tolower(static_cast<int>(c[k]))) : '\0'; };
  const char a = low(i + 1), b = low(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' || a == 'v') && b == 'e') return 3;
  if (a == 'l' && b == 'l') return 3;
  return 0;
}

// \p{N}{1,max} at i: its length, or 0.
size_t DigitGroup(const Cps& c, size_t i, size_t max) {
  size_t e = i;
  while (e < c.size() && e - i < max && IsNumber(c[e])) ++e;
  return e - i;
}

// The white space alternatives shared by the expressions below, tried in order at i:
// \s*[\r\n]+ (up to the last line break of the white space run), \s+(?!\S), \s+.
size_t WhitespaceTail(const Cps& c, size_t i) {
  size_t w = i;
  while (w < c.size() && IsWhitespace(c[w])) ++w;
  if (w == i) return 0;
  for (size_t p = w; p > i; --p) {
    if (IsLineBreak(c[p - 1])) return p - i;
  }
  if (w == c.size() || w - i == 1) return w - i;  // (?!\S) holds at the end; one space falls to \s+
  return w - 1 - i;
}

// gpt-4o (o200k: gpt-oss, Llama 4), as Hugging Face's tokenizer.json spells it:
//   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|...)?
//   |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|...)?
//   |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
// each alternative with the regex's backtracking (an optional leading character is tried first
// taken, then not).
size_t MatchGpt4o(const Cps& c, size_t i) {
  const size_t n = c.size();
  auto upper = [](uint32_t x) {
    const auto k = Cat(x);
    return k == UTF8PROC_CATEGORY_LU || k == UTF8PROC_CATEGORY_LT || k == UTF8PROC_CATEGORY_LM ||
           k == UTF8PROC_CATEGORY_LO || IsMark(x);
  };
  auto lower = [](uint32_t x) {
    const auto k = Cat(x);
    return k == UTF8PROC_CATEGORY_LL || k == UTF8PROC_CATEGORY_LM || k == UTF8PROC_CATEGORY_LO || IsMark(x);
  };
  auto lead_ok = [](uint32_t x) { return !IsLineBreak(x) && !IsLetter(x) && !IsNumber(x); };
  for (int alt = 0; alt < 2; ++alt) {
    for (int lead = 1; lead >= 0; --lead) {
      size_t j = i;
      if (lead) {
        if (!lead_ok(c[j])) continue;
        ++j;
      }
      size_t k = j;
      while (k < n && upper(c[k])) ++k;
      size_t end = 0;
      if (alt == 0) {  // upper* lower+: the longest upper run that a lower character follows
        for (size_t a = k + 1; a-- > j;) {
          if (a < n && lower(c[a])) {
            end = a;
            while (end < n && lower(c[end])) ++end;
            break;
          }
        }
      } else if (k > j) {  // upper+ lower*
        end = k;
        while (end < n && lower(c[end])) ++end;
      }
      if (end > 0) return end + Contraction(c, end) - i;
    }
  }
  if (const size_t digits = DigitGroup(c, i, 3)) return digits;
  auto other = [](uint32_t x) { return !IsWhitespace(x) && !IsLetter(x) && !IsNumber(x); };
  size_t j = i;
  if (c[j] == ' ' && j + 1 < n && other(c[j + 1])) ++j;
  if (other(c[j])) {
    while (j < n && other(c[j])) ++j;
    while (j < n && (IsLineBreak(c[j]) || c[j] == '/')) ++j;
    return j - i;
  }
  return WhitespaceTail(c, i);
}

// DeepSeek-V3's third expression:
//   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
//   | ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t MatchDeepseekV3(const Cps& c, size_t i) {
  const size_t n = c.size();
  auto ascii_letter = [](uint32_t x) { return (x >= 'a' && x <= 'z') || (x >= 'A' && x <= 'Z'); };
  auto ascii_punct = [](uint32_t x) {
    return (x >= 0x21 && x <= 0x2f) || (x >= 0x3a && x <= 0x40) || (x >= 0x5b && x <= 0x60) || (x >= 0x7b && x <= 0x7e);
  };
  if (ascii_punct(c[i]) && i + 1 < n && ascii_letter(c[i + 1])) {
    size_t e = i + 1;
    while (e < n && ascii_letter(c[e])) ++e;
    return e - i;
  }
  auto word = [](uint32_t x) { return IsLetter(x) || IsMark(x); };
  auto punct = [](uint32_t x) { return IsPunctuation(x) || IsSymbol(x); };
  for (int lead = 1; lead >= 0; --lead) {
    size_t j = i;
    if (lead) {
      if (IsLineBreak(c[j]) || IsLetter(c[j]) || punct(c[j])) continue;
      ++j;
    }
    if (j < n && word(c[j])) {
      while (j < n && word(c[j])) ++j;
      return j - i;
    }
  }
  size_t j = i;
  if (c[j] == ' ' && j + 1 < n && punct(c[j + 1])) ++j;
  if (punct(c[j])) {
    while (j < n && punct(c[j])) ++j;
    while (j < n && IsLineBreak(c[j])) ++j;
    return j - i;
  }
  return WhitespaceTail(c, i);
}

}  // namespace

std::vector<std::string_view> PreTokenizeGpt4o(std::string_view text) {
  static const std::vector<Pass> passes = {MatchGpt4o};
  return ApplyPasses(text, passes);
}

std::vector<std::string_view> PreTokenizeDeepseekV3(std::string_view text) {
  static const std::vector<Pass> passes = {
      [](const Cps& c, size_t i) { return DigitGroup(c, i, 3); },  // \p{N}{1,3}
      Run([](uint32_t x) {  // [\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+
        return (x >= 0x4e00 && x <= 0x9fa5) || (x >= 0x3040 && x <= 0x309f) || (x >= 0x30a0 && x <= 0x30ff);
      }),
      MatchDeepseekV3,
  };
  return ApplyPasses(text, passes);
}

std::vector<std::string_view> PreTokenizeDeepseekCoder(std::string_view text) {
  static const std::vector<Pass> passes = {
      LineBreak(), OptionalSpaceRun(IsLetter), OptionalSpaceRun(IsPunctuation), Run(IsCjk),
      [](const Cps& cps, size_t i) -> size_t { return IsNumber(cps[i]) ? 1 : 0; },
  };
  return ApplyPasses(text, passes);
}

std::vector<std::string_view> PreTokenizeDeepseekLlm(std::string_view text) {
  // DeepSeek LLM's letter and punctuation classes, as its tokenizer's expressions spell them. The
  // characters that Unicode normalization (NFC) would replace (U+1F7D, U+1FBE, U+1FD3, U+1FDB,
  // U+2126, U+212A) are written as escapes, so that an editor that normalizes cannot change the class.
  static const auto letters = ParseClass(
      "A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-\u1F7Dᾀ-ᾴᾶ-ᾼ\u1FBEῂ-ῄ"
      "ῆ-ῌῐ-\u1FD3ῖ-\u1FDBῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤ\u2126ℨ\u212A-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻"
      "𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃");
  static const auto punct = ParseClass("!-/:-~！-／：-～‘-‟　-。");
  static const std::vector<Pass> passes = {
      LineBreak(),
      OptionalSpaceRun([](uint32_t c) { return InRanges(letters, c); }),
      OptionalSpaceRun([](uint32_t c) { return InRanges(punct, c); }),
      // \s+$ : the white space that ends a piece.
      [](const Cps& cps, size_t i) -> size_t {
        for (size_t j = i; j < cps.size(); ++j) {
          if (!IsWhitespace(cps[j])) return 0;
        }
        return cps.size() - i;
      },
      Run(IsCjk),
      Run(IsNumber),
  };
  return ApplyPasses(text, passes);
}

std::vector<std::string> PreTokenizeBert(std::string_view text) {
  utf8proc_uint8_t* nfd = nullptr;
  const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                static_cast<utf8proc_ssize_t>(text.size()), &nfd, UTF8PROC_DECOMPOSE);
  // Invalid UTF-8 cannot be normalized: fall back to the raw text, byte errors become U+FFFD.
  std::string normalized = len >= 0 ? std::string(reinterpret_cast<const char*>(nfd), static_cast<size_t>(len))
                                    : std::string(text);
  std::free(nfd);
  auto is_cjk = [](uint32_t c) {
    return (c >= 0x4e00 && c <= 0x9fff) || (c >= 0x3400 && c <= 0x4dbf) || (c >= 0x20000 && c <= 0x2a6df) ||
           (c >= 0x2a700 && c <= 0x2b73f) || (c >= 0x2b740 && c <= 0x2b81f) || (c >= 0x2b820 && c <= 0x2ceaf) ||
           (c >= 0xf900 && c <= 0xfaff) || (c >= 0x2f800 && c <= 0x2fa1f);
  };
  std::vector<std::string> words(1);
  for (size_t i = 0; i < normalized.size();) {
    uint32_t cp;
    i += static_cast<size_t>(DecodeUtf8(std::string_view(normalized).substr(i), &cp));
    if (IsWhitespace(cp)) {
      if (!words.back().empty()) words.emplace_back();
      continue;
    }
    const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(cp));
    // Control characters go, and so do the accents NFD split off (BERT's strip_accents).
    if (cp == 0 || cp == 0xfffd || cat == UTF8PROC_CATEGORY_CC || cat == UTF8PROC_CATEGORY_CF ||
        cat == UTF8PROC_CATEGORY_CS || cat == UTF8PROC_CATEGORY_CO || cat == UTF8PROC_CATEGORY_MN) {
      continue;
    }
    utf8proc_uint8_t buf[4];
    const auto n = utf8proc_encode_char(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp)), buf);
    const std::string ch(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
    const bool symbol = cat == UTF8PROC_CATEGORY_SM || cat == UTF8PROC_CATEGORY_SC || cat == UTF8PROC_CATEGORY_SK ||
                        cat == UTF8PROC_CATEGORY_SO;
    if (IsPunctuation(cp) || (cp < 0x7f && symbol) || is_cjk(cp)) {
      if (!words.back().empty()) words.emplace_back();
      words.back() = ch;
      words.emplace_back();
    } else {
      words.back() += ch;
    }
  }
  if (words.back().empty()) words.pop_back();
  return words;
}

int DecodeUtf8(std::string_view s, uint32_t* cp) {
  const int len = Utf8CharLength(s);
  if (len <= 0) {
    *cp = 0xfffd;
    return 1;
  }
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  uint32_t c = len == 1 ? p[0] : len == 2 ? (p[0] & 0x1fu) : len == 3 ? (p[0] & 0x0fu) : (p[0] & 0x07u);
  for (int i = 1; i < len; ++i) c = (c << 6) | (p[i] & 0x3fu);
  *cp = c;
  return len;
}

const std::string& ByteToBpeChar(uint8_t b) { return Tables().byte_to_char[b]; }

int BpeCharToByte(uint32_t code_point) {
  return code_point < Tables().char_to_byte.size() ? Tables().char_to_byte[code_point] : -1;
}

std::vector<std::string_view> PreTokenizeLlama3(std::string_view text, int max_digits, bool with_marks) {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;
  DecodeAll(text, &cps, &offsets);
  const size_t n = cps.size();
  auto ws = [&](size_t i) { return i < n && IsWhitespace(cps[i]); };
  // Qwen3.5: letter runs take combining marks too ([\p{L}\p{M}]+), and marks leave the
  // punctuation class.
  auto letter = [&](size_t i) { return i < n && (IsLetter(cps[i]) || (with_marks && IsMark(cps[i]))); };
  auto number = [&](size_t i) { return i < n && IsNumber(cps[i]); };
  auto newline = [&](size_t i) { return i < n && (cps[i] == '\r' || cps[i] == '\n'); };

  std::vector<std::string_view> words;
  size_t pos = 0;
  while (pos < n) {
    const uint32_t c = cps[pos];
    // (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])
    size_t end = pos + Contraction(cps, pos);
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if (end == pos) {
      const bool lead = !newline(pos) && !letter(pos) && !number(pos) && letter(pos + 1);
      if (lead || letter(pos)) {
        end = lead ? pos + 1 : pos;
        while (letter(end)) ++end;
      }
    }
    // \p{N}{1,3} (or one digit at a time)
    if (end == pos) end = pos + DigitGroup(cps, pos, static_cast<size_t>(max_digits));
    // " ?[^\s\p{L}\p{N}]+[\r\n]*"
    if (end == pos) {
      const size_t start = c == ' ' ? pos + 1 : pos;
      auto other = [&](size_t i) { return i < n && !ws(i) && !letter(i) && !number(i); };
      if (other(start)) {
        end = start;
        while (other(end)) ++end;
        while (newline(end)) ++end;
      }
    }
    // \s*[\r\n]+|\s+(?!\S)|\s+ (every character is one of the classes above or white space)
    if (end == pos) end = pos + std::max<size_t>(WhitespaceTail(cps, pos), 1);
    words.push_back(text.substr(offsets[pos], offsets[end] - offsets[pos]));
    pos = end;
  }
  return words;
}

std::vector<std::string_view> PreTokenizeGpt2(std::string_view text) {
  std::vector<uint32_t> cps;
  std::vector<size_t> offsets;
  DecodeAll(text, &cps, &offsets);
  const size_t n = cps.size();
  auto at = [&](size_t i) -> uint32_t { return i < n ? cps[i] : 0xffffffffu; };
  auto ws = [&](size_t i) { return i < n && IsWhitespace(cps[i]); };
  auto letter = [&](size_t i) { return i < n && IsLetter(cps[i]); };
  auto number = [&](size_t i) { return i < n && IsNumber(cps[i]); };
  auto other = [&](size_t i) { return i < n && !IsWhitespace(cps[i]) && !IsLetter(cps[i]) && !IsNumber(cps[i]); };

  std::vector<std::string_view> words;
  size_t pos = 0;
  while (pos < n) {
    size_t end = pos;
    const uint32_t c = cps[pos];
    // 's|'t|'re|'ve|'m|'ll|'d
    if (c == '\'') {
      const uint32_t c1 = at(pos + 1), c2 = at(pos + 2);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') end = pos + 2;
      else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) end = pos + 3;
    }
    if (end == pos) {
      const size_t start = (c == ' ') ? pos + 1 : pos;  // the optional leading space
      if (letter(start)) {  // ' ?\p{L}+'
        end = start;
        while (letter(end)) ++end;
      } else if (number(start)) {  // ' ?\p{N}+'
        end = start;
        while (number(end)) ++end;
      } else if (other(start)) {  // ' ?[^\s\p{L}\p{N}]+'
        end = start;
        while (other(end)) ++end;
      } else {
        // \s+(?!\S)|\s+ : a run of white space, less its last character when a non-space follows
        // (that one then leads the next word), unless the run is a single character.
        end = pos;
        while (ws(end)) ++end;
        if (end < n && end - pos > 1) --end;
      }
    }
    words.push_back(text.substr(offsets[pos], offsets[end] - offsets[pos]));
    pos = end;
  }
  return words;
}

}  // namespace gale
