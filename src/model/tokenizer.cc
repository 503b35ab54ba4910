// SentencePiece-style BPE as llama.cpp's llm_tokenizer_spm does it: start from UTF-8 characters,
// repeatedly merge the adjacent pair whose concatenation is the highest-scoring vocab entry (ties:
// leftmost), then emit ids, resegmenting or byte-falling-back what is not in the vocab.
#include "model/tokenizer.h"

#include "base/utf8.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <queue>

#include <utf8proc.h>

#include "model/bpe.h"

namespace gale {
namespace {

constexpr std::string_view kSpaceMarker = "\xe2\x96\x81";  // U+2581 '▁'

std::string ReplaceAll(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    if (s.compare(i, from.size(), from) == 0) {
      out += to;
      i += from.size();
    } else {
      out += s[i++];
    }
  }
  return out;
}

// Ids of text pieces within one Encode call: each distinct piece is encoded once (words repeat,
// Zipf), later occurrences copy its ids.
class PieceCache {
 public:
  template <typename EncodeFn>
  void Emit(std::string_view piece, EncodeFn encode, std::vector<int32_t>* out) {
    auto it = ids_.find(piece);
    if (it == ids_.end()) {
      std::vector<int32_t> ids;
      encode(piece, &ids);
      it = ids_.emplace(piece, std::move(ids)).first;
    }
    out->insert(out->end(), it->second.begin(), it->second.end());
  }

 private:
  std::unordered_map<std::string_view, std::vector<int32_t>> ids_;
};

}  // namespace


// A BPE vocabulary's pre-tokenizer (tokenizer.ggml.pre).
Status Tokenizer::ReadPreTokenizer(const GgufFile& file) {
  // No pre-tokenizer named: llama.cpp's default one (gpt-neox's files have none).
  const std::string pre = file.GetString("tokenizer.ggml.pre").ok() ? *file.GetString("tokenizer.ggml.pre") : "default";
  if (pre == "gpt-2" || pre == "mpt") {
    split_ = BpeSplit::kGpt2;
  } else if (pre == "default") {
    split_ = BpeSplit::kDefault;
  } else if (pre == "starcoder" || pre == "refact" || pre == "command-r") {
    split_ = BpeSplit::kDigitsThenGpt2;  // every digit its own piece before the GPT-2 split
  } else if (pre == "falcon") {
    split_ = BpeSplit::kFalcon;
  } else if (pre == "deepseek-coder") {
    split_ = BpeSplit::kDeepseekCoder;
  } else if (pre == "deepseek-llm") {
    split_ = BpeSplit::kDeepseekLlm;
  } else if (pre == "llama3" || pre == "llama-v3" || pre == "llama-bpe" || pre == "dbrx" || pre == "smaug-bpe" ||
             pre == "falcon3" || pre == "pixtral") {
    split_ = BpeSplit::kLlama3;
    llama3_digits_ = 3;
    ignore_merges_ = true;  // Llama 3's tokenizer.json: a word that is a token is not merged
  } else if (pre == "glm4" || pre == "chatglm-bpe") {
    split_ = BpeSplit::kLlama3;
    llama3_digits_ = 3;  // Llama 3's expression, merges applied to every word
  } else if (pre == "qwen2" || pre == "deepseek-r1-qwen" || pre == "qwen35") {
    split_ = BpeSplit::kLlama3;
    llama3_digits_ = 1;
    llama3_marks_ = pre == "qwen35";
    // Qwen2/2.5/3's tokenizer.json normalizes to NFC first (llama.cpp does not); Qwen3.5's
    // does not (its vectors keep decomposed accents), its letter runs take the marks instead.
    nfc_ = pre != "qwen35";
  } else if (pre == "deepseek-v3") {
    split_ = BpeSplit::kDeepseekV3;
  } else if (pre == "gpt-4o" || pre == "llama4") {
    split_ = BpeSplit::kGpt4o;
    ignore_merges_ = true;  // o200k's tokenizer.json: a word that is a token is not merged
  } else {
    return Unimplemented(
        "pre-tokenizer '{}' is not supported yet (gale has default, gpt-2, mpt, starcoder, refact, command-r, falcon, "
        "deepseek-coder, deepseek-llm, deepseek-v3, llama3/llama-bpe, glm4, qwen2, qwen35, gpt-4o)", pre);
  }
  return Status::Ok();
}

// The tokenizer model (SPM, BPE with its pre-tokenizer and merges, WordPiece).
Status Tokenizer::ReadModel(const GgufFile& file) {
  ASSIGN_OR_RETURN(std::string model, file.GetString("tokenizer.ggml.model"));
  if (model == "gpt2") {
    kind_ = Kind::kBpe;
    RETURN_IF_ERROR(ReadPreTokenizer(file));
    const GgufValue* merges = file.Find("tokenizer.ggml.merges");
    if (merges == nullptr || !merges->IsArrayOf(GgufValueType::kString)) {
      return InvalidArgument("tokenizer.ggml.merges is missing or not an array of strings (needed for BPE)");
    }
    merge_rank_.reserve(merges->array.size());
    for (size_t i = 0; i < merges->array.size(); ++i) {
      const std::string& m = merges->array[i].str;
      if (m.find(' ') == std::string::npos || m.find(' ') == 0 || m.find(' ') + 1 == m.size()) {
        return InvalidArgument("tokenizer.ggml.merges[{}] = '{}' is not two symbols separated by a space", i, m);
      }
      merge_rank_.emplace(m, static_cast<int32_t>(i));
    }
    add_space_prefix_ = false;
    add_bos_ = false;  // BPE vocabs that want BOS say so with add_bos_token (Llama 3 does)
  } else if (model == "bert") {
    kind_ = Kind::kWpm;
    add_space_prefix_ = false;
    // [CLS] text [SEP], as llama.cpp frames a WordPiece input with add_special (its add_bos and
    // add_sep; the file's add_bos_token / add_sep_token keys turn them off).
    add_bos_ = true;
    add_sep_ = true;
  } else if (model != "llama") {
    return Unimplemented("tokenizer model '{}' is not supported yet (gale reads 'llama', 'gpt2' and 'bert')", model);
  }
  return Status::Ok();
}

// The tokens, their scores and types.
Status Tokenizer::ReadVocab(const GgufFile& file) {
  const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr || !tokens->IsArrayOf(GgufValueType::kString)) {
    return InvalidArgument("tokenizer.ggml.tokens is missing or not an array of strings");
  }
  const size_t n = tokens->array.size();
  if (n == 0 || n > (1u << 24)) return InvalidArgument("tokenizer.ggml.tokens has {} entries", n);
  tokens_.reserve(n);
  for (const auto& v : tokens->array) tokens_.push_back(v.str);
  scores_.assign(n, 0.0f);
  if (const GgufValue* s = file.Find("tokenizer.ggml.scores")) {
    if (!s->IsArrayOf(GgufValueType::kFloat32) || s->array.size() != n) {
      return InvalidArgument("tokenizer.ggml.scores must be {} float32 values", n);
    }
    for (size_t i = 0; i < n; ++i) scores_[i] = static_cast<float>(*s->array[i].AsDouble());
  }
  types_.assign(n, TokenType::kNormal);
  if (const GgufValue* ty = file.Find("tokenizer.ggml.token_type")) {
    if (ty->type != GgufValueType::kArray || ty->array.size() != n) {
      return InvalidArgument("tokenizer.ggml.token_type must have {} entries", n);
    }
    for (size_t i = 0; i < n; ++i) {
      const auto v = ty->array[i].AsInt();
      if (!v || *v < 0 || *v > 6) return InvalidArgument("tokenizer.ggml.token_type[{}] is not a token type", i);
      types_[i] = static_cast<TokenType>(*v);
    }
  }
  // User-defined tokens with these texts are control tokens (llama.cpp's end-of-generation and
  // fill-in-the-middle names), so that user text like "<|im_end|>" or "</s>" stays text unless
  // special tokens are parsed. The list is the one llama.cpp's loader answers to (checked text by
  // text against its library). llama.cpp also turns normal vocabulary tokens with these texts into
  // control ones (Qwen's "</s>" is one, which then never decodes); gale leaves them normal, as
  // Hugging Face's tokenizer has them. It overrides only the first match of each fill-in-the-middle
  // role; gale every one (text stays text in more files, never less).
  static constexpr std::string_view kControlLooking[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>", "<|endoftext|>",
      "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>", "<end_of_utterance>", "<｜end▁of▁sentence｜>",
      "</s>", "<eos>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|fim_pad|>", "<|fim_repo|>",
      "<|repo_name|>", "<|file_sep|>", "<fim-prefix>", "<fim-suffix>", "<fim-middle>", "<fim-pad>", "<fim-repo>",
      "<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<fim_pad>", "<reponame>", "<PRE>", "<SUF>", "<MID>", "<PAD>",
      "<REPO>", "▁<PRE>", "▁<SUF>", "▁<MID>", "<|code_prefix|>", "<|code_suffix|>",
      "<|code_middle|>", "<｜fim▁begin｜>", "<｜fim▁hole｜>",
      "<｜fim▁end｜>"};
  for (size_t i = 0; i < n; ++i) {
    if (types_[i] == TokenType::kUserDefined &&
        std::find(std::begin(kControlLooking), std::end(kControlLooking), tokens_[i]) != std::end(kControlLooking)) {
      types_[i] = TokenType::kControl;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    token_to_id_.emplace(tokens_[i], static_cast<int32_t>(i));
    max_token_bytes_ = std::max(max_token_bytes_, tokens_[i].size());
  }

  return Status::Ok();
}

// The special ids and the add_* flags.
Status Tokenizer::ReadSpecialIds(const GgufFile& file) {
  const size_t n = tokens_.size();
  auto read_id = [&](const char* key, int32_t def) -> StatusOr<int32_t> {
    const GgufValue* v = file.Find(key);
    if (v == nullptr) return def;
    auto id = v->AsInt();
    if (!id) return InvalidArgument("{} is not an integer", key);
    if (*id == 0xffffffffll || *id == -1) return -1;
    if (*id < 0 || *id >= static_cast<int64_t>(n)) return InvalidArgument("{} = {} is outside the vocab of {}", key, *id, n);
    return static_cast<int32_t>(*id);
  };
  if (kind_ == Kind::kWpm) {
    // BERT: the "BOS" is [CLS] (cls_token_id), the separator [SEP]; no end-of-sequence token.
    ASSIGN_OR_RETURN(const int32_t cls, read_id("tokenizer.ggml.cls_token_id", -1));
    ASSIGN_OR_RETURN(bos_id_, read_id("tokenizer.ggml.bos_token_id", cls));
    ASSIGN_OR_RETURN(sep_id_, read_id("tokenizer.ggml.seperator_token_id", -1));
    ASSIGN_OR_RETURN(eos_id_, read_id("tokenizer.ggml.eos_token_id", -1));
  } else {
    ASSIGN_OR_RETURN(bos_id_, read_id("tokenizer.ggml.bos_token_id", n > 1 ? 1 : -1));
    ASSIGN_OR_RETURN(eos_id_, read_id("tokenizer.ggml.eos_token_id", n > 2 ? 2 : -1));
  }
  ASSIGN_OR_RETURN(unk_id_, read_id("tokenizer.ggml.unknown_token_id", 0));
  ASSIGN_OR_RETURN(eot_id_, read_id("tokenizer.ggml.eot_token_id", -1));
  // End of generation: the ids the file names, then special tokens by text (llama.cpp's list in
  // its release of 2026-09-28, llama-vocab.cpp).
  for (const char* key : {"tokenizer.ggml.eom_token_id", "tokenizer.ggml.fim_pad_token_id", "tokenizer.ggml.fim_rep_token_id",
                          "tokenizer.ggml.fim_sep_token_id"}) {
    ASSIGN_OR_RETURN(const int32_t id, read_id(key, -1));
    if (id >= 0) eog_ids_.push_back(id);
  }
  static constexpr std::string_view kEogTexts[] = {
      "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
      "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>",
      "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["};
  auto special = [&](int32_t id) { return types_[id] == TokenType::kControl || types_[id] == TokenType::kUserDefined; };
  for (std::string_view text : kEogTexts) {
    auto it = token_to_id_.find(text);
    if (it != token_to_id_.end() && special(it->second)) eog_ids_.push_back(it->second);
  }
  // harmony (gpt-oss) and solar-open end a turn's message with <|end|> and the turn with
  // <|return|> / <|call|> (<|flush|> / <|calls|>): <|end|> then does not end generation.
  auto eog_text = [&](std::string_view text) {
    auto it = token_to_id_.find(text);
    return it != token_to_id_.end() && std::find(eog_ids_.begin(), eog_ids_.end(), it->second) != eog_ids_.end();
  };
  if (eog_text("<|end|>") && ((eog_text("<|return|>") && eog_text("<|call|>")) || (eog_text("<|flush|>") && eog_text("<|calls|>")))) {
    const int32_t end = token_to_id_.find(std::string_view("<|end|>"))->second;
    eog_ids_.erase(std::remove(eog_ids_.begin(), eog_ids_.end(), end), eog_ids_.end());
  }
  // Gemma 4's vocabularies end a call's turn with <|tool_response>; their "</s>" is then text
  // (llama.cpp's loader drops it from the ends as well).
  if (eog_text("<|tool_response>") && eog_text("</s>")) {
    const int32_t s = token_to_id_.find(std::string_view("</s>"))->second;
    eog_ids_.erase(std::remove(eog_ids_.begin(), eog_ids_.end(), s), eog_ids_.end());
  }
  for (int32_t id : {eos_id_, eot_id_}) {
    if (id >= 0) eog_ids_.push_back(id);
  }
  std::sort(eog_ids_.begin(), eog_ids_.end());
  eog_ids_.erase(std::unique(eog_ids_.begin(), eog_ids_.end()), eog_ids_.end());
  if (const GgufValue* v = file.Find("tokenizer.ggml.add_bos_token"); v && v->AsBool()) add_bos_ = *v->AsBool();
  if (const GgufValue* v = file.Find("tokenizer.ggml.add_eos_token"); v && v->AsBool()) add_eos_ = *v->AsBool();
  if (const GgufValue* v = file.Find("tokenizer.ggml.add_sep_token"); v && v->AsBool()) add_sep_ = *v->AsBool();
  if (const GgufValue* v = file.Find("tokenizer.ggml.add_space_prefix"); v && v->AsBool()) {
    add_space_prefix_ = *v->AsBool();
  }

  return Status::Ok();
}

// What encoding looks up: byte tokens, special tokens (longest first), Phi-3's right-stripping
// ones, whether SPM text may be encoded in chunks.
void Tokenizer::BuildTables(const GgufFile& file) {
  const size_t n = tokens_.size();
  for (int b = 0; b < 256; ++b) {
    if (kind_ == Kind::kBpe) {  // byte-level vocab: every byte is a printable character
      auto it = token_to_id_.find(ByteToBpeChar(static_cast<uint8_t>(b)));
      byte_token_[b] = it != token_to_id_.end() ? it->second : unk_id_;
      continue;
    }
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    auto it = token_to_id_.find(hex);
    if (it == token_to_id_.end()) it = token_to_id_.find(std::string(1, static_cast<char>(b)));
    byte_token_[b] = it != token_to_id_.end() ? it->second : unk_id_;
  }
  for (size_t i = 0; i < n; ++i) {
    const TokenType ty = types_[i];
    if ((ty == TokenType::kControl || ty == TokenType::kUserDefined || ty == TokenType::kUnknown) &&
        !tokens_[i].empty()) {
      special_ids_.push_back(static_cast<int32_t>(i));
    }
  }
  // Phi-3's special tokens swallow the whitespace after them (llama.cpp sets that by the model's
  // name: its tokenizer.json strips right of them), except <unk>, <s> and <|endoftext|>.
  rstrip_.assign(n, false);
  if (auto name = file.GetString("general.name"); name.ok()) {
    std::string lower = *name;
    std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
    if (lower.find("phi-3") != std::string::npos || lower.find("phi3") != std::string::npos) {
      for (int32_t id : special_ids_) rstrip_[static_cast<size_t>(id)] = true;
      for (const char* keep : {"<unk>", "<s>", "<|endoftext|>"}) {
        if (auto it = token_to_id_.find(keep); it != token_to_id_.end()) rstrip_[static_cast<size_t>(it->second)] = false;
      }
    }
  }
  // SPM texts may be encoded chunk by chunk when no token has a '▁' after another character.
  spm_chunkable_ = kind_ == Kind::kSpm;
  for (const std::string& tok : tokens_) {
    size_t i = 0;
    while (tok.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0) i += kSpaceMarker.size();
    if (tok.find(kSpaceMarker, i) != std::string::npos) {
      spm_chunkable_ = false;
      break;
    }
  }
  std::stable_sort(special_ids_.begin(), special_ids_.end(), [&](int32_t a, int32_t b) {
    return tokens_[a].size() > tokens_[b].size();
  });
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGguf(const GgufFile& file) {
  std::unique_ptr<Tokenizer> t(new Tokenizer());
  RETURN_IF_ERROR(t->ReadModel(file));
  RETURN_IF_ERROR(t->ReadVocab(file));
  RETURN_IF_ERROR(t->ReadSpecialIds(file));
  t->BuildTables(file);
  return t;
}

int32_t Tokenizer::ByteToToken(uint8_t byte) const { return byte_token_[byte]; }

void Tokenizer::EncodeSpm(std::string_view text, std::vector<int32_t>* out) const {
  const std::string escaped = ReplaceAll(text, " ", kSpaceMarker);
  if (!spm_chunkable_) {
    EncodeSpmChunk(escaped, out);
    return;
  }
  // No vocab entry has a '▁' after a non-'▁' character, so no symbol can ever span the start of
  // a run of '▁': the text splits there into chunks that merge independently, exactly as the
  // whole would. Repeated chunks (words) are encoded once per call.
  PieceCache cache;
  const std::string_view all(escaped);
  size_t start = 0;
  auto flush = [&](size_t end) {
    if (end <= start) return;
    cache.Emit(all.substr(start, end - start),
               [this](std::string_view chunk, std::vector<int32_t>* ids) { EncodeSpmChunk(chunk, ids); }, out);
    start = end;
  };
  for (size_t i = 0; i < all.size(); ++i) {
    const bool marker = all.compare(i, kSpaceMarker.size(), kSpaceMarker) == 0;
    const bool after_marker = i >= kSpaceMarker.size() &&
                              all.compare(i - kSpaceMarker.size(), kSpaceMarker.size(), kSpaceMarker) == 0;
    if (marker && !after_marker) flush(i);
  }
  flush(all.size());
}

void Tokenizer::EncodeSpmChunk(std::string_view escaped, std::vector<int32_t>* out) const {
  struct Symbol {
    int prev, next;
    const char* text;
    size_t n;
  };
  struct Bigram {
    int left, right;
    float score;
    size_t size;
  };
  struct Worse {
    bool operator()(const Bigram& a, const Bigram& b) const {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    }
  };
  std::vector<Symbol> symbols;
  for (size_t offs = 0; offs < escaped.size();) {
    int len = Utf8CharLength(std::string_view(escaped).substr(offs));
    size_t n = len > 0 ? static_cast<size_t>(len) : 1;  // invalid/incomplete: one byte
    n = std::min(n, escaped.size() - offs);
    const int idx = static_cast<int>(symbols.size());
    symbols.push_back({idx - 1, offs + n == escaped.size() ? -1 : idx + 1, escaped.data() + offs, n});
    offs += n;
  }
  std::priority_queue<Bigram, std::vector<Bigram>, Worse> queue;
  auto try_add = [&](int left, int right) {
    if (left == -1 || right == -1) return;
    const std::string_view s(symbols[left].text, symbols[left].n + symbols[right].n);
    auto it = token_to_id_.find(s);
    if (it == token_to_id_.end()) return;
    queue.push({left, right, scores_[it->second], s.size()});
  };
  for (int i = 1; i < static_cast<int>(symbols.size()); ++i) try_add(i - 1, i);
  while (!queue.empty()) {
    const Bigram b = queue.top();
    queue.pop();
    Symbol& l = symbols[b.left];
    Symbol& r = symbols[b.right];
    if (l.n == 0 || r.n == 0 || l.n + r.n != b.size) continue;  // stale
    l.n += r.n;
    r.n = 0;
    l.next = r.next;
    if (r.next >= 0) symbols[r.next].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }
  // Emit. Every merged symbol is a vocab entry (merges only happen into one), so a symbol that is
  // not in the vocab is a single character never merged: it falls back to byte tokens.
  for (int i = symbols.empty() ? -1 : 0; i != -1; i = symbols[i].next) {
    const std::string_view s(symbols[i].text, symbols[i].n);
    auto it = token_to_id_.find(s);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      continue;
    }
    for (char ch : s) out->push_back(ByteToToken(static_cast<uint8_t>(ch)));
  }
}

void Tokenizer::BpeWord(std::string_view word, std::vector<int32_t>* out) const {
  // Symbols: the word's bytes as BPE characters; merge the adjacent pair of lowest rank until
  // none is in the merge list (ties: leftmost). Words are short, so a simple scan per merge.
  std::vector<std::string> sym;
  sym.reserve(word.size());
  for (char ch : word) sym.push_back(ByteToBpeChar(static_cast<uint8_t>(ch)));
  if (ignore_merges_ && sym.size() > 1) {
    std::string whole;
    for (const std::string& s : sym) whole += s;
    if (auto it = token_to_id_.find(whole); it != token_to_id_.end()) {
      out->push_back(it->second);
      return;
    }
  }
  std::string key;
  while (sym.size() > 1) {
    int32_t best_rank = INT32_MAX;
    size_t best = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      key.assign(sym[i]).append(" ").append(sym[i + 1]);
      auto it = merge_rank_.find(key);
      if (it != merge_rank_.end() && it->second < best_rank) {
        best_rank = it->second;
        best = i;
      }
    }
    if (best_rank == INT32_MAX) break;
    sym[best] += sym[best + 1];
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  for (const std::string& piece : sym) {
    auto it = token_to_id_.find(piece);
    if (it != token_to_id_.end()) {
      out->push_back(it->second);
      continue;
    }
    // Not in the vocab: one token per byte it stands for.
    for (size_t i = 0; i < piece.size();) {
      uint32_t cp;
      i += static_cast<size_t>(DecodeUtf8(std::string_view(piece).substr(i), &cp));
      const int b = BpeCharToByte(cp);
      if (b >= 0) out->push_back(byte_token_[b]);
    }
  }
}

// WordPiece as llama.cpp stores it: word-initial pieces carry the '▁' marker, continuations
// none. Greedy longest match from the left; a word with any unmatched rest becomes one [UNK].
void Tokenizer::EncodeWpm(std::string_view text, std::vector<int32_t>* out) const {
  for (const std::string& w : PreTokenizeBert(text)) {
    const std::string word = std::string(kSpaceMarker) + w;
    const size_t first = out->size();
    bool matched_all = true;
    for (size_t i = 0; i < word.size();) {
      size_t j = std::min(word.size(), i + max_token_bytes_);
      bool found = false;
      for (; j > i; --j) {
        auto it = token_to_id_.find(word.substr(i, j - i));
        if (it != token_to_id_.end()) {
          out->push_back(it->second);
          found = true;
          break;
        }
      }
      if (!found) {
        matched_all = false;
        break;
      }
      i = j;
    }
    if (!matched_all) {
      out->resize(first);
      if (unk_id_ >= 0) out->push_back(unk_id_);
    }
  }
}

void Tokenizer::EncodeBpe(std::string_view raw, std::vector<int32_t>* out) const {
  std::string normalized;
  std::string_view text = raw;
  if (nfc_) {
    utf8proc_uint8_t* nfc = nullptr;
    const auto len = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(raw.data()),
                                  static_cast<utf8proc_ssize_t>(raw.size()), &nfc, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (len >= 0) {  // invalid UTF-8 is left as it is: its bytes become byte tokens
      normalized.assign(reinterpret_cast<const char*>(nfc), static_cast<size_t>(len));
      text = normalized;
    }
    std::free(nfc);
  }
  PieceCache cache;
  auto word_ids = [&](std::string_view word) {
    cache.Emit(word, [this](std::string_view w, std::vector<int32_t>* ids) { BpeWord(w, ids); }, out);
  };
  switch (split_) {
    case BpeSplit::kGpt2:
      for (std::string_view word : PreTokenizeGpt2(text)) word_ids(word);
      return;
    case BpeSplit::kDeepseekCoder:
      for (std::string_view word : PreTokenizeDeepseekCoder(text)) word_ids(word);
      return;
    case BpeSplit::kDeepseekLlm:
      for (std::string_view word : PreTokenizeDeepseekLlm(text)) word_ids(word);
      return;
    case BpeSplit::kDeepseekV3:
      for (std::string_view word : PreTokenizeDeepseekV3(text)) word_ids(word);
      return;
    case BpeSplit::kGpt4o:
      for (std::string_view word : PreTokenizeGpt4o(text)) word_ids(word);
      return;
    case BpeSplit::kLlama3:
      for (std::string_view word : PreTokenizeLlama3(text, llama3_digits_, llama3_marks_)) word_ids(word);
      return;
    case BpeSplit::kDefault:  // punctuation runs (no backtick), GPT-2's split, number runs, digit triples
      for (std::string_view a : SplitPunctuationRuns(text, false)) {
        for (std::string_view b : PreTokenizeGpt2(a)) {
          for (std::string_view c : SplitNumberRuns(b)) {
            for (std::string_view d : SplitDigitTriples(c)) word_ids(d);
          }
        }
      }
      return;
    case BpeSplit::kFalcon:
      for (std::string_view a : SplitPunctuationRuns(text)) {
        for (std::string_view b : PreTokenizeGpt2(a)) {
          for (std::string_view c : SplitDigitTriples(b)) word_ids(c);
        }
      }
      return;
    case BpeSplit::kDigitsThenGpt2:
      break;
  }
  // Each number character is a piece of its own; the runs between them go through GPT-2's split.
  size_t run_start = 0;
  for (size_t i = 0; i < text.size();) {
    uint32_t cp;
    const int len = DecodeUtf8(text.substr(i), &cp);
    if (IsUnicodeNumber(cp)) {
      for (std::string_view word : PreTokenizeGpt2(text.substr(run_start, i - run_start))) word_ids(word);
      word_ids(text.substr(i, static_cast<size_t>(len)));
      run_start = i + static_cast<size_t>(len);
    }
    i += static_cast<size_t>(len);
  }
  for (std::string_view word : PreTokenizeGpt2(text.substr(run_start))) word_ids(word);
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special, bool parse_special) const {
  return Encode(text, add_special, parse_special, {});
}

int32_t Tokenizer::SpecialAt(std::string_view text, size_t i, size_t room, SpecialKinds kinds) const {
  for (int32_t id : special_ids_) {
    const bool user = types_[id] == TokenType::kUserDefined;
    if ((user && kinds == SpecialKinds::kControl) || (!user && kinds == SpecialKinds::kUserDefined)) continue;
    if (tokens_[id].size() <= room && text.compare(i, tokens_[id].size(), tokens_[id]) == 0) return id;
  }
  return -1;
}

std::vector<std::pair<size_t, size_t>> Tokenizer::ControlTextSpans(std::string_view s) const {
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < s.size();) {
    const int32_t id = SpecialAt(s, i, s.size() - i, SpecialKinds::kControl);
    if (id < 0) {
      ++i;
      continue;
    }
    spans.emplace_back(i, i + tokens_[id].size());
    i += tokens_[id].size();
  }
  return spans;
}

std::vector<int32_t> Tokenizer::Encode(std::string_view text, bool add_special, bool parse_special,
                                       const std::vector<std::pair<size_t, size_t>>& literal) const {
  std::vector<int32_t> out;
  size_t next_literal = 0;  // the first literal range that ends after the scan position
  if (add_special && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  // Split the text on special-token texts (user-defined always, control ones when asked).
  bool prev_special = true;  // a fragment at the start or after a special token gets the prefix
  size_t start = 0;
  auto emit_text = [&](std::string_view frag) {
    if (frag.empty()) return;
    if (kind_ != Kind::kSpm) {
      if (kind_ == Kind::kBpe) EncodeBpe(frag, &out);
      else EncodeWpm(frag, &out);
      prev_special = false;
      return;
    }
    std::string s;
    if (add_space_prefix_ && prev_special) s = " ";
    s.append(frag);
    EncodeSpm(s, &out);
    prev_special = false;
  };
  size_t i = 0;
  while (i < text.size()) {
    while (next_literal < literal.size() && literal[next_literal].second <= i) ++next_literal;
    // Inside a literal range nothing matches; before one, a match must end where it starts.
    const bool in_literal = next_literal < literal.size() && literal[next_literal].first <= i;
    const size_t room = in_literal ? 0 : next_literal < literal.size() ? literal[next_literal].first - i : text.size() - i;
    const int32_t match = SpecialAt(text, i, room, parse_special ? SpecialKinds::kAll : SpecialKinds::kUserDefined);
    if (match < 0) {
      ++i;
      continue;
    }
    emit_text(text.substr(start, i - start));
    out.push_back(match);
    prev_special = true;
    i += tokens_[match].size();
    if (rstrip_[static_cast<size_t>(match)]) {
      while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    }
    start = i;
  }
  emit_text(text.substr(start));
  if (add_special && add_eos_ && eos_id_ >= 0) out.push_back(eos_id_);
  if (add_special && add_sep_ && sep_id_ >= 0) out.push_back(sep_id_);
  return out;
}

std::vector<std::vector<int32_t>> Tokenizer::EncodeBatch(const std::vector<std::string>& texts, ThreadPool& pool,
                                                         bool add_special, bool parse_special) const {
  std::vector<std::vector<int32_t>> out(texts.size());
  pool.ParallelFor(static_cast<int64_t>(texts.size()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = Encode(texts[i], add_special, parse_special);
  });
  return out;
}

std::string Tokenizer::TokenToPiece(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return "";
  const std::string& text = tokens_[id];
  switch (types_[id]) {
    case TokenType::kControl:
    case TokenType::kUnused:
      return "";
    case TokenType::kByte:
      // "<0xHH>" is the byte HH; any other text (a hostile vocab's "<0x<s>") stands for itself.
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        auto hex = [](char c) {
          return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        };
        const int hi = hex(text[3]), lo = hex(text[4]);
        if (hi >= 0 && lo >= 0) return std::string(1, static_cast<char>(hi * 16 + lo));
      }
      return text;
    case TokenType::kUserDefined:
      return text;
    default:
      break;
  }
  if (kind_ == Kind::kBpe) {  // each character of the token stands for one byte
    std::string bytes;
    for (size_t i = 0; i < text.size();) {
      uint32_t cp;
      i += static_cast<size_t>(DecodeUtf8(std::string_view(text).substr(i), &cp));
      const int b = BpeCharToByte(cp);
      if (b >= 0) bytes += static_cast<char>(b);
    }
    return bytes;
  }
  return ReplaceAll(text, kSpaceMarker, " ");
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids) const {
  Detokenizer d(*this, /*at_start=*/true);
  std::string out;
  for (int32_t id : ids) out += d.Push(id);
  out += d.Flush();
  return out;
}

std::string Detokenizer::Push(int32_t id) {
  std::string piece = render_special_ && id >= 0 && id < tok_.vocab_size() && tok_.GetTokenType(id) == TokenType::kControl
                          ? tok_.TokenText(id)
                          : tok_.TokenToPiece(id);
  if (at_start_ && !piece.empty()) {
    if (tok_.add_space_prefix() && piece[0] == ' ') piece.erase(0, 1);
    at_start_ = false;
  }
  pending_ += piece;
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const int len = Utf8CharLength(std::string_view(pending_).substr(i));
    if (len == 0) break;  // incomplete: wait for more bytes
    if (len < 0) {
      out += "\xef\xbf\xbd";  // U+FFFD for an invalid byte
      ++i;
      continue;
    }
    out.append(pending_, i, len);
    i += len;
  }
  pending_.erase(0, i);
  return out;
}

std::string Detokenizer::Flush() {
  // An incomplete character at the end of the stream becomes one replacement character.
  std::string out = pending_.empty() ? "" : "\xef\xbf\xbd";
  pending_.clear();
  return out;
}

std::shared_ptr<const grammar::TokenTrie> MakeTokenTrie(const Tokenizer& tok) {
  std::vector<std::string> bytes(static_cast<size_t>(tok.vocab_size()));
  std::vector<bool> usable(bytes.size(), false);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    const TokenType t = tok.GetTokenType(id);
    if (t == TokenType::kControl || t == TokenType::kUnknown || t == TokenType::kUnused) continue;
    bytes[id] = tok.TokenToPiece(id);
    usable[id] = true;
  }
  return std::make_shared<const grammar::TokenTrie>(bytes, usable);
}

}  // namespace gale
