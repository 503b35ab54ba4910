// Pieces of byte-level BPE (GPT-2 style) tokenization that do not need the vocab: the GPT-2
// pre-tokenizer (splitting text into words the way its regex does) and the byte <-> printable
// character mapping the BPE vocab is written in.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace gale {

// Splits text like GPT-2's pre-tokenizer regex
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// (Unicode letters, numbers and white space by their properties). Returns views into text.
// Invalid UTF-8 bytes are treated as one "other" character each.
std::vector<std::string_view> PreTokenizeGpt2(std::string_view text);

// Pre-tokenizer splits beyond GPT-2's, each as llama.cpp applies a regex: the text is cut into
// the regex's matches and the runs between them, all kept, in order.
// [\p{P}$+<=>^~|`]+ : runs of punctuation and those ASCII symbols (falcon, first pass); without
// the backtick for llama.cpp's default BPE pre-tokenizer.
std::vector<std::string_view> SplitPunctuationRuns(std::string_view text, bool with_backtick = true);
// \p{N}+ : runs of Unicode numbers (the default pre-tokenizer's third pass).
std::vector<std::string_view> SplitNumberRuns(std::string_view text);
// [0-9][0-9][0-9] : groups of three ASCII digits, left to right (falcon, last pass).
std::vector<std::string_view> SplitDigitTriples(std::string_view text);

// deepseek-coder's passes, in order: [\r\n], \s?\p{L}+, \s?\p{P}+, [\u0800-\u9FA5\uAC00-\uD7FF]+,
// \p{N} (each pass cuts every piece of the previous one into matches and the runs between).
// Llama 3's expression (also Qwen2's with max_digits = 1): contractions in either case, letter runs
// with one optional leading non-letter/digit/line-break, digits in groups of up to max_digits,
// punctuation runs with one optional leading space and trailing line breaks, white space ending at
// its last line break, and white space runs as GPT-2 splits them.
// with_marks (Qwen3.5): combining marks count as letters.
std::vector<std::string_view> PreTokenizeLlama3(std::string_view text, int max_digits, bool with_marks = false);
std::vector<std::string_view> PreTokenizeDeepseekCoder(std::string_view text);
// DeepSeek LLM: line breaks, runs of its letter class and of ASCII/full-width punctuation (each
// with one optional leading space), trailing white space, CJK runs, digit runs.
std::vector<std::string_view> PreTokenizeDeepseekLlm(std::string_view text);
// gpt-4o's expression (o200k: gpt-oss, Llama 4) with Unicode's letter case categories as Hugging
// Face's tokenizer.json states it: a letter run is an optional leading non-letter/digit/line break,
// a run of upper-case-or-caseless letters and marks, then of lower-case-or-caseless ones (one of
// the two runs non-empty), and an optional contraction; digits in groups of up to three;
// punctuation runs with trailing line breaks and slashes; white space as Llama 3's.
std::vector<std::string_view> PreTokenizeGpt4o(std::string_view text);
// DeepSeek-V3 (also R1): digit groups of up to three, then runs of CJK ideographs and kana, then
// ASCII punctuation + ASCII letters, letter-and-mark runs with one optional leading character,
// punctuation/symbol runs, white space.
std::vector<std::string_view> PreTokenizeDeepseekV3(std::string_view text);

// BERT's basic tokenizer as llama.cpp runs it before WordPiece: NFD, accents (Mn) dropped, lower
// case, white space
// separates words, control characters dropped, and every punctuation mark, ASCII symbol and CJK
// ideograph is a word of its own.
std::vector<std::string> PreTokenizeBert(std::string_view text);

// The printable character (as UTF-8) byte b is written as in byte-level BPE vocabs.
const std::string& ByteToBpeChar(uint8_t b);
// The byte a BPE character stands for, or -1 when the code point is not one of the 256.
int BpeCharToByte(uint32_t code_point);

// Unicode general category N* (what \p{N} matches).
bool IsUnicodeNumber(uint32_t code_point);

// Decodes one UTF-8 character at s[0]; returns its length (1 for an invalid byte, whose code
// point is then reported as 0xFFFD) and sets *cp.
int DecodeUtf8(std::string_view s, uint32_t* cp);

}  // namespace gale
