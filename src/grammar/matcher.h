// Grammar-constrained decoding: which tokens may come next.
//
// TokenTrie: the vocabulary as bytes, in a trie laid out in preorder, built once per tokenizer.
// CompiledGrammar: a grammar bound to a trie, with a cache of token masks shared by every request
// that uses it (thread-safe). GrammarMatcher: one request's position in the grammar.
//
// The matcher is a pushdown recognizer over code points (llama.cpp's grammar stacks, with the
// stacks hash-consed into a per-matcher arena so a step never copies them): a state is the set
// of stacks whose tops are character sets (or a named token, <[N]>), plus the bytes of a UTF-8
// character a token left unfinished. A token is allowed when walking its bytes from the state leaves at least one
// stack. A state's mask walks the trie once, sharing the work of tokens with common prefixes and
// skipping a subtree as soon as its prefix is dead. Masks are a function of the state's stack
// contents, so they are cached under that content (inside a JSON string, every step has the same
// state, and so does every request with the same schema). The state is a function of the tokens
// accepted so far: preemption, prefix-cache hits and batching do not touch it.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "base/thread_clock.h"
#include "grammar/grammar.h"

namespace gale::grammar {

class TokenTrie {
 public:
  // token_bytes[i]: the bytes token i stands for; tokens with usable[i] false or no bytes are
  // never produced by text (control tokens); stop tokens are handled apart.
  TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& usable);

  int32_t vocab_size() const { return vocab_size_; }
  const std::string& bytes(int32_t token) const { return token_bytes_[token]; }
  bool usable(int32_t token) const { return usable_[token]; }

  // Preorder nodes: node i's subtree is [i, i + subtree[i]); its parent is the last node before
  // it with depth one less. Node 0 is the root (no byte).
  struct Node {
    uint8_t byte;
    uint16_t depth;
    int32_t subtree;       // nodes in the subtree, itself included
    int32_t token_begin;   // tokens ending here: tokens_[token_begin, token_end)
    int32_t token_end;
  };
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<int32_t>& tokens() const { return tokens_; }
  int max_depth() const { return max_depth_; }

 private:
  int32_t vocab_size_;
  std::vector<std::string> token_bytes_;
  std::vector<bool> usable_;
  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;
  int max_depth_ = 0;
};

// Bits over the vocabulary: bit t set = token t allowed.
using TokenMask = std::vector<uint64_t>;

class GrammarMatcher;

class CompiledGrammar {
 public:
  CompiledGrammar(Grammar g, std::shared_ptr<const TokenTrie> trie, size_t cache_bytes = size_t{64} << 20);
  ~CompiledGrammar();
  const Grammar& grammar() const { return grammar_; }
  const TokenTrie& trie() const { return *trie_; }

  // The shared mask cache: key is a state's canonical content; a mask holds the tokens whose text
  // (or whose id, for <[N]>) continues the state, before stop tokens (each matcher applies its own).
  std::shared_ptr<const TokenMask> Find(const std::vector<int32_t>& key) const;
  void Insert(const std::vector<int32_t>& key, std::shared_ptr<const TokenMask> mask) const;
  int64_t cache_hits() const;
  int64_t cache_misses() const;

  // What every matcher of this grammar starts from: the arena after the start rule's expansion,
  // built (and its first mask cached) by Prepare, which GrammarCompiler runs off the engine's
  // thread under a deadline. Null until then: a matcher then expands the start itself.
  const GrammarMatcher* start() const { return start_.get(); }
  // Builds the start within `deadline`; an error (the grammar too ambiguous, or too slow to
  // follow) leaves the grammar without one. Not thread-safe: call before sharing the grammar.
  Status Prepare(ThreadCpuClock::time_point deadline);

 private:
  struct KeyHash {
    size_t operator()(const std::vector<int32_t>& k) const;
  };
  Grammar grammar_;
  std::shared_ptr<const TokenTrie> trie_;
  size_t cache_capacity_;  // masks kept
  mutable std::mutex mu_;
  mutable std::unordered_map<std::vector<int32_t>, std::shared_ptr<const TokenMask>, KeyHash> cache_;
  mutable int64_t hits_ = 0, misses_ = 0;
  std::unique_ptr<const GrammarMatcher> start_;
};

// Limits of one matcher (a hostile grammar can make states explode; each limit ends only the
// request that passes it, with an error naming it). The arena: ~80 bytes a node with its memo
// tables, so at most ~20 MiB per request; a tool-call schema's walk takes a few thousand.
inline constexpr int64_t kMaxMatcherNodes = 1 << 18;
inline constexpr size_t kMaxStacksPerState = 1 << 14;
// Work units one call may cost (a check, a mask): a unit is a stack node expanded, a stack
// advanced by a character or a trie node walked (~7 ns), a new stack node four. 8M units are
// 50-70 ms of one core, the longest one request may hold the engine's step before it is ended.
// The costliest ordinary mask, the inside of a JSON string over Qwen3's 151,669 tokens, takes
// ~2M (build/grammar_bench prints the most a schema's walk took).
inline constexpr int64_t kMaxWorkPerCall = int64_t{1} << 23;

class GrammarMatcher {
 public:
  // stop_tokens: allowed (and only they end the text) where the grammar may end. Starts from the
  // grammar's prepared start when it has one (a copy of a small arena), else expands the start
  // rule itself.
  GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, std::vector<int32_t> stop_tokens);

  // Whether the token may come next (cheap: walks only its bytes).
  bool Allows(int32_t token);
  // How many of the tokens may come next in a row (nothing is taken).
  size_t AllowedPrefix(std::span<const int32_t> tokens);
  // Takes the token; an error if it is not allowed (the state is then unchanged).
  Status Accept(int32_t token);
  // Sets the logits of tokens that may not come next to -inf. False when no token may (a
  // grammar the vocabulary cannot spell, or one past the limits below; the caller ends the
  // request).
  bool MaskLogits(std::span<float> logits);
  // The allowed tokens, stop tokens included where the grammar may end (cached per state).
  std::shared_ptr<const TokenMask> Mask();

  // The text so far is a complete sentence of the grammar (stop tokens are allowed).
  bool CanEnd() const;
  // Nothing may follow: the text is complete and no character can extend it.
  bool Done() const;

  // Set when a limit was passed (a grammar too ambiguous to follow: too many stacks, too much
  // work for one token, or past the deadline); nothing is allowed after that.
  const Status& status() const { return status_; }
  int64_t num_nodes() const { return static_cast<int64_t>(nodes_.size()); }
  // Work units the last call from outside spent (of kMaxWorkPerCall).
  int64_t last_call_work() const { return kMaxWorkPerCall - work_left_ - work_reserve_; }

 private:
  friend class CompiledGrammar;  // builds the start (Prepare)
  using Clock = ThreadCpuClock;
  static constexpr int32_t kAccept = 0;  // the empty stack: the grammar is complete
  static constexpr int32_t kNone = -1;
  struct StackNode {
    int32_t pos;     // an element of the grammar (kChars at the top of a matcher state)
    int32_t parent;  // where to continue when this alternative ends (kAccept: the end)
  };
  // A state: stacks (node ids, each topped by a kChars element, or kAccept) and a partial UTF-8
  // character.
  struct State {
    std::vector<int32_t> stacks;
    uint32_t partial = 0;   // the bits of the unfinished character so far
    int remaining = 0;      // continuation bytes it still needs
    int length = 0;         // its length in bytes (the smallest code point of that length bounds it)
  };

  // The start's builder: no owner (the grammar owns it), work bounded by `deadline`.
  GrammarMatcher(const CompiledGrammar* grammar, Clock::time_point deadline);
  void ExpandStart();

  // Work accounting: every call from outside gets kMaxWorkPerCall units (a stack node expanded,
  // a stack advanced by a character, a trie node walked); Spend is false once they (or the
  // deadline) are used up, with status_ saying which.
  void BeginCall();
  bool Spend(int64_t units) { return (work_left_ -= units) >= 0 || Refill(); }
  bool Refill();

  int32_t Node(int32_t pos, int32_t parent);
  void AppendNode(int32_t pos, int32_t parent);  // a new id in every per-node table
  // Terminal-topped stacks (or kAccept) node `id` stands for.
  const std::vector<int32_t>& Expand(int32_t id);
  // Stacks after the character at the top of `id` is matched.
  const std::vector<int32_t>& Successors(int32_t id);
  // in -> out by one byte; false when no stack survives.
  bool AdvanceByte(const State& in, uint8_t byte, State* out);
  // in -> out by one (non-stop) token: its bytes, or the token itself where a stack's top is
  // that token (<[N]>); the union of both. False when neither continues (out is then garbage).
  bool Step(const State& in, int32_t token, State* out);
  void AdvanceCodePoint(const std::vector<int32_t>& in, uint32_t cp, std::vector<int32_t>* out);
  bool IsStop(int32_t token) const;
  std::vector<int32_t> Key();
  // The current state's mask before stop tokens, from the grammar's cache or computed (and
  // cached when complete).
  std::shared_ptr<const TokenMask> TextMask();
  std::shared_ptr<TokenMask> ComputeMask();

  const CompiledGrammar* grammar_;
  std::shared_ptr<const CompiledGrammar> owner_;  // keeps grammar_ alive (null in the start)
  const Grammar* g_;
  std::vector<int32_t> stop_tokens_;
  State state_;
  // The arena: hash-consed stack nodes and their memoized expansions.
  std::vector<StackNode> nodes_;
  // (pos, parent) -> node id: open addressing with linear probing, a power-of-two size at most
  // half full (std::unordered_map's buckets made node lookups most of a walk's time).
  struct NodeIds {
    std::vector<uint64_t> keys;  // kEmpty where free
    std::vector<int32_t> ids;
    size_t size = 0;
    static constexpr uint64_t kEmpty = ~uint64_t{0};
    // The id stored under key, or the slot where it would go (returned negated minus one).
    int64_t Find(uint64_t key) const;
    void Insert(uint64_t key, int32_t id);
  };
  NodeIds node_ids_;
  std::vector<std::vector<int32_t>> expand_;       // [nodes]
  std::vector<std::vector<int32_t>> successors_;   // [nodes]
  std::vector<uint8_t> have_expand_, have_successors_;
  std::vector<uint32_t> seen_;   // [nodes] dedup stamps of AdvanceCodePoint
  std::vector<uint32_t> visit_;  // [nodes] dedup stamps of Expand
  uint32_t seen_stamp_ = 0, visit_stamp_ = 0;
  std::vector<int32_t> work_;    // scratch of Expand
  State scratch_[2];             // scratch of Step's byte walk
  State step_;                   // the state after the token Allows last checked (Accept takes it)
  Status status_;
  std::vector<State> walk_;     // [trie depth] scratch of ComputeMask
  std::shared_ptr<const TokenMask> text_mask_;  // of the current state, once known
  std::shared_ptr<const TokenMask> mask_;       // the same with stop tokens applied
  // Work: units left before Refill looks again, and beyond that in this call.
  int64_t work_left_ = 0, work_reserve_ = 0;
  Clock::time_point deadline_ = Clock::time_point::max();
};

}  // namespace gale::grammar
