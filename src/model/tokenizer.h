// Tokenizer built from GGUF metadata (tokenizer.ggml.*). Now: SentencePiece-style vocabularies
// (`tokenizer.ggml.model = llama`): score-ordered pair merges, byte fallback `<0xXX>`,
// add-space-prefix; and byte-level BPE (`gpt2`) with ranked merges and the GPT-2 pre-tokenizer
// (`tokenizer.ggml.pre` = gpt-2). BOS/EOS and special tokens for both. Other tokenizer models and
// pre-tokenizers get a clear Unimplemented.
// Also the incremental Detokenizer, which never emits a broken UTF-8 sequence.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "base/status.h"
#include "base/utf8.h"
#include "base/thread_pool.h"
#include "gguf/gguf_file.h"
#include "grammar/matcher.h"

namespace gale {

// llama.cpp's token types (tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  static StatusOr<std::unique_ptr<Tokenizer>> FromGguf(const GgufFile& file);

  // Text to ids. add_bos follows the vocab's add_bos_token unless overridden; parse_special
  // lets control-token texts like "</s>" (and the unknown token's) in the input become those
  // tokens; without it they stay text. User-defined tokens are always matched, as in llama.cpp.
  std::vector<int32_t> Encode(std::string_view text, bool add_special = true, bool parse_special = false) const;
  // The same, except that no special token is matched where its text would overlap one of the
  // literal byte ranges [first, second) (sorted, disjoint): text a caller must keep as text.
  std::vector<int32_t> Encode(std::string_view text, bool add_special, bool parse_special,
                              const std::vector<std::pair<size_t, size_t>>& literal) const;
  // Where the texts of control and unknown tokens occur in s (leftmost, longest first: the spans
  // Encode with parse_special would turn into those tokens), as byte ranges [first, second).
  std::vector<std::pair<size_t, size_t>> ControlTextSpans(std::string_view s) const;
  // Many texts at once on the pool (Encode is const and thread-safe); out[i] is texts[i]'s ids.
  std::vector<std::vector<int32_t>> EncodeBatch(const std::vector<std::string>& texts, ThreadPool& pool,
                                                bool add_special = true, bool parse_special = false) const;

  // The bytes a token stands for: byte tokens give their byte, control tokens nothing, '▁' is a
  // space. May be a partial UTF-8 sequence (byte fallback).
  std::string TokenToPiece(int32_t id) const;
  // Whole-sequence decode; drops the leading space that add-space-prefix put in front.
  std::string Decode(const std::vector<int32_t>& ids) const;

  // SPM only: encode the text as one piece instead of word chunks (slower; the same result where
  // chunking is allowed). For tests that check that equivalence.
  void DisableSpmChunking() { spm_chunkable_ = false; }
  bool spm_chunking() const { return spm_chunkable_; }

  int32_t vocab_size() const { return static_cast<int32_t>(tokens_.size()); }
  // The most text bytes one token stands for (its stored text's length bounds them): a text of n
  // bytes is at least n / max_token_bytes() tokens, known without tokenizing it.
  size_t max_token_bytes() const { return max_token_bytes_ > 0 ? max_token_bytes_ : 1; }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  int32_t eot_id() const { return eot_id_; }
  bool add_bos() const { return add_bos_; }
  bool add_space_prefix() const { return add_space_prefix_; }
  // The tokens that end generation, as llama.cpp's loader marks them: eos, eot, eom and the
  // fill-in-the-middle pad/repository/separator ids the file sets, and special (control or
  // user-defined) tokens whose text is an end-of-turn name ("<|im_end|>", "<end_of_turn>", GLM's
  // "<|observation|>" comes as eom). Sorted. A normal token never ends generation (gale: "</s>" in a
  // BPE vocabulary is text, where llama.cpp ends on it).
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  bool IsEog(int32_t id) const { return std::binary_search(eog_ids_.begin(), eog_ids_.end(), id); }
  const std::string& TokenText(int32_t id) const { return tokens_[id]; }
  // The id of the token whose text is exactly `text` (special tokens included); -1 when none.
  int32_t TokenId(std::string_view text) const {
    auto it = token_to_id_.find(text);
    return it == token_to_id_.end() ? -1 : it->second;
  }
  TokenType GetTokenType(int32_t id) const { return types_[id]; }

 private:
  // Maps looked up with string_views (no allocation per lookup on the hot path).
  struct TextHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  Tokenizer() = default;
  // FromGguf's steps, in order.
  Status ReadModel(const GgufFile& file);
  Status ReadPreTokenizer(const GgufFile& file);
  Status ReadVocab(const GgufFile& file);
  Status ReadSpecialIds(const GgufFile& file);
  void BuildTables(const GgufFile& file);
  void EncodeSpm(std::string_view text, std::vector<int32_t>* out) const;
  void EncodeSpmChunk(std::string_view escaped, std::vector<int32_t>* out) const;
  void EncodeBpe(std::string_view text, std::vector<int32_t>* out) const;
  void BpeWord(std::string_view word, std::vector<int32_t>* out) const;

  void EncodeWpm(std::string_view text, std::vector<int32_t>* out) const;
  // The first special token (special_ids_ order: longest text first) of the given kinds whose text
  // starts at text[i] and fits in room bytes; -1 when none does.
  enum class SpecialKinds { kAll, kUserDefined, kControl /* control and unknown */ };
  int32_t SpecialAt(std::string_view text, size_t i, size_t room, SpecialKinds kinds) const;

  enum class Kind { kSpm, kBpe, kWpm };
  Kind kind_ = Kind::kSpm;
  std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> merge_rank_;  // "left right" -> rank
  // How byte-level BPE text is cut into words before merging (tokenizer.ggml.pre).
  enum class BpeSplit {
    kGpt2,            // gpt-2, mpt
    kDigitsThenGpt2,  // starcoder, refact, command-r: every digit its own piece first
    kFalcon,          // punctuation runs first, digit triples last
    kDefault,         // llama.cpp's default: falcon's passes without `, plus number runs
    kDeepseekCoder,
    kDeepseekLlm,
    kDeepseekV3,
    kGpt4o,
    kLlama3,          // Llama 3's expression (llama3_digits_, llama3_marks_): llama3, glm4, qwen2, qwen35
  };
  BpeSplit split_ = BpeSplit::kGpt2;
  bool nfc_ = false;            // text normalized to Unicode NFC before the split (Qwen2)
  int llama3_digits_ = 0;       // kLlama3: digit groups of up to this size (Qwen2: 1)
  bool llama3_marks_ = false;   // kLlama3, Qwen3.5: combining marks in letter runs
  bool ignore_merges_ = false;  // a word that is itself a token is emitted without merging
  bool spm_chunkable_ = false;  // see EncodeSpm
  size_t max_token_bytes_ = 0;  // longest token text (WordPiece's longest-match bound)
  int32_t ByteToToken(uint8_t byte) const;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  std::unordered_map<std::string, int32_t, TextHash, std::equal_to<>> token_to_id_;
  std::vector<int32_t> special_ids_;  // control, user-defined and unknown, longest text first
  std::vector<bool> rstrip_;          // by id: whitespace after this special token is dropped
  int32_t bos_id_ = -1, eos_id_ = -1, eot_id_ = -1, unk_id_ = -1;
  int32_t sep_id_ = -1;  // WordPiece's [SEP], appended with add_special (add_sep_)
  std::vector<int32_t> eog_ids_;
  bool add_sep_ = false;
  bool add_bos_ = true;
  bool add_eos_ = false;
  bool add_space_prefix_ = true;
  int32_t byte_token_[256];
};

// Turns a stream of token ids into text chunks that are always whole UTF-8 characters.
// Bytes of a character split across tokens are held until the character completes; an invalid
// sequence becomes U+FFFD. Flush() returns what is left at the end of the stream.
class Detokenizer {
 public:
  // at_start: the next token is the first after BOS, so its add-space-prefix space is dropped.
  // render_special: control tokens come out as their text (gpt-oss's harmony format marks its
  // channels and tool calls with them).
  Detokenizer(const Tokenizer& tok, bool at_start, bool render_special = false)
      : tok_(tok), at_start_(at_start), render_special_(render_special) {}
  std::string Push(int32_t id);
  std::string Flush();

 private:
  const Tokenizer& tok_;
  bool at_start_;
  bool render_special_;
  std::string pending_;  // bytes of an incomplete UTF-8 character
};

// The vocabulary as grammars see it: each token's bytes (TokenToPiece); control, unknown and
// unused tokens are never produced by text.
std::shared_ptr<const grammar::TokenTrie> MakeTokenTrie(const Tokenizer& tok);


}  // namespace gale
