#include "model/arch/deepseek4_engram.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>
#include <unordered_map>

#include <utf8proc.h>

#include "model/bpe.h"

namespace gale {
namespace {

// Rust's char::is_whitespace (Unicode White_Space), which Hugging Face's Strip uses.
bool IsWhiteSpace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || c == 0x20 || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

std::vector<uint32_t> CodePoints(const std::string& s) {
  std::vector<uint32_t> out;
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    i += static_cast<size_t>(DecodeUtf8(std::string_view(s).substr(i), &cp));
    out.push_back(cp);
  }
  return out;
}

std::string Utf8(const std::vector<uint32_t>& cps) {
  std::string out;
  for (uint32_t c : cps) {
    uint8_t buf[4];
    const utf8proc_ssize_t n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c), buf);
    out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
  }
  return out;
}

// utf8proc_map over the whole string (embedded NULs included).
std::string Map(const std::string& s, int options) {
  utf8proc_uint8_t* out = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &out,
                                          static_cast<utf8proc_option_t>(options));
  if (n < 0) return s;  // not valid UTF-8: callers pass only valid text
  std::string r(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
  std::free(out);
  return r;
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s->find(from, at)) != std::string::npos; at += to.size()) s->replace(at, from.size(), to);
}

// Valid UTF-8 with no U+FFFD: what from_utf8_lossy returns unchanged and without a replacement.
bool CleanUtf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    const int n = DecodeUtf8(std::string_view(s).substr(i), &cp);
    if (cp == 0xFFFD) return false;
    i += static_cast<size_t>(n);
  }
  return true;
}

bool IsPrime(uint64_t v) {
  if (v < 2) return false;
  if (v % 2 == 0) return v == 2;
  for (uint64_t d = 3; d * d <= v; d += 2) {
    if (v % d == 0) return false;
  }
  return true;
}

}  // namespace

std::string EngramDecodeToken(const std::string& token, bool clean_up_spaces) {
  std::string bytes;
  bool mapped = true;
  for (uint32_t cp : CodePoints(token)) {
    const int b = BpeCharToByte(cp);
    if (b < 0) {
      mapped = false;
      break;
    }
    bytes += static_cast<char>(b);
  }
  if (!mapped) bytes = token;
  if (clean_up_spaces) {  // transformers' clean_up_tokenization
    for (const char* p : {" .", " ?", " !", " ,"}) ReplaceAll(&bytes, p, std::string(p + 1));
    ReplaceAll(&bytes, " ' ", "'");
    for (const char* p : {" n't", " 'm", " 's", " 've", " 're"}) ReplaceAll(&bytes, p, std::string(p + 1));
  }
  return bytes;
}

std::string EngramNormalize(const std::string& text) {
  std::string s = Map(text, UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);  // NFKC
  s = Map(s, UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);                                 // NFD
  std::vector<uint32_t> cps;
  for (uint32_t c : CodePoints(s)) {
    const utf8proc_category_t cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
    if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC || cat == UTF8PROC_CATEGORY_ME) continue;
    const uint32_t lower = static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
    // Runs of space, tab, CR, LF to one space.
    const bool sp = lower == ' ' || lower == '\t' || lower == '\r' || lower == '\n';
    if (sp && !cps.empty() && cps.back() == ' ') {
      // the previous one was such a run's space already
      continue;
    }
    cps.push_back(sp ? ' ' : lower);
  }
  // A lone space stays (the reference shields it from the strip); otherwise strip white space.
  if (cps.size() == 1 && cps[0] == ' ') return " ";
  size_t b = 0, e = cps.size();
  while (b < e && IsWhiteSpace(cps[b])) ++b;
  while (e > b && IsWhiteSpace(cps[e - 1])) --e;
  return Utf8(std::vector<uint32_t>(cps.begin() + static_cast<std::ptrdiff_t>(b), cps.begin() + static_cast<std::ptrdiff_t>(e)));
}

StatusOr<std::vector<uint32_t>> EngramTokenMap(const nlohmann::json& tj, bool clean_up_spaces, int64_t vocab,
                                               int64_t* compressed) {
  std::map<int64_t, std::string> by_id;
  if (!tj.contains("model") || !tj["model"].is_object() || !tj["model"].contains("vocab") ||
      !tj["model"]["vocab"].is_object()) {
    return InvalidArgument("tokenizer.json: model.vocab is missing");
  }
  const std::string decoder = tj.contains("decoder") && tj["decoder"].is_object() ? tj["decoder"].value("type", "") : "";
  if (decoder != "ByteLevel") {
    return Unimplemented("tokenizer.json: Engram's token map needs a byte-level tokenizer (decoder '{}')", decoder);
  }
  for (const auto& [piece, id] : tj["model"]["vocab"].items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (int64_t{1} << 26)) {
      return InvalidArgument("tokenizer.json: vocab entry '{}' has no valid id", piece);
    }
    by_id[id.get<int64_t>()] = piece;
  }
  if (tj.contains("added_tokens") && tj["added_tokens"].is_array()) {
    for (const auto& a : tj["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() || !a.contains("content") ||
          !a["content"].is_string() || a["id"].get<int64_t>() < 0 || a["id"].get<int64_t>() >= (int64_t{1} << 26)) {
        return InvalidArgument("tokenizer.json: an added token without a valid id and content");
      }
      by_id[a["id"].get<int64_t>()] = a["content"].get<std::string>();
    }
  }
  const int64_t n = by_id.empty() ? 0 : by_id.rbegin()->first + 1;
  if (n > vocab) return InvalidArgument("tokenizer.json has {} ids, the model {}", n, vocab);
  std::unordered_map<std::string, uint32_t> key_id;
  std::vector<uint32_t> map(static_cast<size_t>(vocab));
  for (int64_t id = 0; id < n; ++id) {
    auto it = by_id.find(id);
    const std::string raw = it != by_id.end() ? it->second : "";
    const std::string text = EngramDecodeToken(raw, clean_up_spaces);
    std::string key;
    if (!CleanUtf8(text)) {
      key = raw;
    } else {
      key = EngramNormalize(text);
      if (key.empty()) key = text;
    }
    auto [k, added] = key_id.emplace(key, static_cast<uint32_t>(key_id.size()));
    map[id] = k->second;
  }
  *compressed = static_cast<int64_t>(key_id.size());
  for (int64_t id = n; id < vocab; ++id) map[id] = static_cast<uint32_t>(*compressed + (id - n));
  return map;
}

std::vector<uint64_t> EngramPrimes(int64_t layers, int64_t orders, int64_t heads, const std::vector<int64_t>& vocab_per_order) {
  std::set<uint64_t> seen;
  std::vector<uint64_t> out;
  for (int64_t l = 0; l < layers; ++l) {
    for (int64_t o = 0; o < orders; ++o) {
      uint64_t start = static_cast<uint64_t>(vocab_per_order[static_cast<size_t>(o)] - 1);
      for (int64_t h = 0; h < heads; ++h) {
        uint64_t c = start + 1;
        while (seen.count(c) != 0 || !IsPrime(c)) ++c;
        seen.insert(c);
        out.push_back(c);
        start = c;
      }
    }
  }
  return out;
}

}  // namespace gale
