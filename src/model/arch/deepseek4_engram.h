// DeepSeek-V4.1's Engram constants, which its checkpoint does not store: its reference computes
// them when the model is built, and a GGUF must carry them (llama.cpp's deepseek41 keys). From
// DeepSeek's Engram reference (engram_demo_v1.py) as V4.1's config parameterizes it:
// - the token map: every token id of the tokenizer decoded alone (Hugging Face's decode, special
//   tokens kept), normalized (NFKC, NFD, marks dropped, lower case, runs of space/tab/CR/LF to one
//   space, a lone space kept, white space stripped at both ends), ids numbered by first
//   occurrence of their normalized text; a token whose decoding is not valid UTF-8 (U+FFFD)
//   keys on its raw vocab string, one that normalizes to nothing on its decoded text;
// - per Engram layer the hash multipliers: np.random.default_rng(seed + 10007 * layer).integers(
//   0, max(1, (2^63 - 1) // compressed_vocab // 2), max_ngram) * 2 + 1;
// - per layer, n-gram order and head a prime bucket count: the first prime after
//   engram_vocab_size - 1 (restarting for every order) that no earlier head took, and the
//   buckets of a layer side by side (offsets).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"

namespace gale {

// The text Hugging Face's tokenizer decodes one token to, as bytes (may be invalid UTF-8):
// byte-level vocab strings through GPT-2's byte map (a string with a character outside the map
// as its own UTF-8), with transformers' clean-up of spaces before punctuation when asked.
std::string EngramDecodeToken(const std::string& token, bool clean_up_spaces);

// The normalization above of valid UTF-8 text (NFKC ... strip).
std::string EngramNormalize(const std::string& text);

// The token map of a tokenizer.json (its vocab and added tokens; ids up to the largest one) for
// `vocab` ids: ids past the tokenizer's get fresh ids after the last one. *compressed: the
// number of distinct keys among the tokenizer's ids (the config's engram_compressed_vocab_size).
StatusOr<std::vector<uint32_t>> EngramTokenMap(const nlohmann::json& tokenizer_json, bool clean_up_spaces,
                                               int64_t vocab, int64_t* compressed);

// The bucket counts of `layers` Engram layers in order: [layer][order][head] flattened.
std::vector<uint64_t> EngramPrimes(int64_t layers, int64_t orders, int64_t heads, const std::vector<int64_t>& vocab_per_order);

}  // namespace gale
