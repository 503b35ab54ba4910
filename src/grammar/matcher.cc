// The vocabulary trie, the shared mask cache, and the pushdown matcher.
#include "grammar/matcher.h"

#include <algorithm>
#include <cmath>

namespace gale::grammar {

namespace {
// Tokens longer than this never come out of a grammar (no vocabulary has such; it bounds the
// trie's depth).
constexpr size_t kMaxTokenBytes = 1024;
// The smallest code point a UTF-8 sequence of each length may encode.
constexpr uint32_t kMinCodePoint[5] = {0, 0, 0x80, 0x800, 0x10000};
}  // namespace

TokenTrie::TokenTrie(const std::vector<std::string>& token_bytes, const std::vector<bool>& usable)
    : vocab_size_(static_cast<int32_t>(token_bytes.size())), token_bytes_(token_bytes), usable_(usable) {
  usable_.resize(token_bytes.size(), false);
  std::vector<int32_t> order;
  for (int32_t t = 0; t < vocab_size_; ++t) {
    if (!usable_[t] || token_bytes_[t].empty() || token_bytes_[t].size() > kMaxTokenBytes) {
      usable_[t] = false;
      continue;
    }
    order.push_back(t);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    return token_bytes_[a] < token_bytes_[b] || (token_bytes_[a] == token_bytes_[b] && a < b);
  });
  nodes_.push_back({0, 0, 0, 0, 0});
  std::vector<int32_t> path = {0};  // node per depth along the last token's bytes
  const std::string* prev = nullptr;
  auto pop_to = [&](size_t depth) {
    while (path.size() > depth + 1) {
      nodes_[path.back()].subtree = static_cast<int32_t>(nodes_.size()) - path.back();
      path.pop_back();
    }
  };
  for (int32_t t : order) {
    const std::string& s = token_bytes_[t];
    size_t common = 0;
    if (prev != nullptr) {
      while (common < s.size() && common < prev->size() && s[common] == (*prev)[common]) ++common;
    }
    pop_to(common);
    for (size_t k = common; k < s.size(); ++k) {
      const int32_t idx = static_cast<int32_t>(nodes_.size());
      nodes_.push_back({static_cast<uint8_t>(s[k]), static_cast<uint16_t>(k + 1), 1,
                        static_cast<int32_t>(tokens_.size()), static_cast<int32_t>(tokens_.size())});
      path.push_back(idx);
    }
    max_depth_ = std::max(max_depth_, static_cast<int>(s.size()));
    Node& n = nodes_[path.back()];
    if (n.token_end != static_cast<int32_t>(tokens_.size())) n.token_begin = n.token_end = static_cast<int32_t>(tokens_.size());
    tokens_.push_back(t);
    n.token_end = static_cast<int32_t>(tokens_.size());
    prev = &s;
  }
  pop_to(0);
  nodes_[0].subtree = static_cast<int32_t>(nodes_.size());
}

CompiledGrammar::CompiledGrammar(Grammar g, std::shared_ptr<const TokenTrie> trie, size_t cache_bytes)
    : grammar_(std::move(g)), trie_(std::move(trie)) {
  const size_t mask_bytes = (static_cast<size_t>(trie_->vocab_size()) + 63) / 64 * 8 + 64;
  cache_capacity_ = std::max<size_t>(16, cache_bytes / mask_bytes);
}

CompiledGrammar::~CompiledGrammar() = default;

Status CompiledGrammar::Prepare(ThreadCpuClock::time_point deadline) {
  auto start = std::unique_ptr<GrammarMatcher>(new GrammarMatcher(this, deadline));
  start->ExpandStart();
  start->TextMask();  // the first mask, into the shared cache
  RETURN_IF_ERROR(start->status_);
  start->deadline_ = ThreadCpuClock::time_point::max();
  start->text_mask_.reset();
  start_ = std::move(start);
  return Status::Ok();
}

size_t CompiledGrammar::KeyHash::operator()(const std::vector<int32_t>& k) const {
  uint64_t h = 1469598103934665603ull;
  for (int32_t v : k) h = (h ^ static_cast<uint32_t>(v)) * 1099511628211ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

std::shared_ptr<const TokenMask> CompiledGrammar::Find(const std::vector<int32_t>& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = cache_.find(key);
  if (it == cache_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  return it->second;
}

void CompiledGrammar::Insert(const std::vector<int32_t>& key, std::shared_ptr<const TokenMask> mask) const {
  std::lock_guard<std::mutex> lock(mu_);
  // NOTE: full means start over; the states a schema revisits come back within a few steps.
  if (cache_.size() >= cache_capacity_) cache_.clear();
  cache_.emplace(key, std::move(mask));
}

int64_t CompiledGrammar::cache_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

int64_t CompiledGrammar::cache_misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

GrammarMatcher::GrammarMatcher(const CompiledGrammar* grammar, Clock::time_point deadline)
    : grammar_(grammar), g_(&grammar->grammar()), deadline_(deadline) {}

GrammarMatcher::GrammarMatcher(std::shared_ptr<const CompiledGrammar> grammar, std::vector<int32_t> stop_tokens) {
  if (const GrammarMatcher* start = grammar->start()) {
    *this = *start;  // the arena of the start: a few hundred nodes for a schema
  } else {
    grammar_ = grammar.get();
    g_ = &grammar->grammar();
    ExpandStart();
  }
  owner_ = std::move(grammar);
  stop_tokens_ = std::move(stop_tokens);
}

void GrammarMatcher::ExpandStart() {
  BeginCall();
  AppendNode(-1, kNone);  // kAccept
  const uint32_t stamp = ++seen_stamp_;
  for (int32_t start : g_->alternatives[g_->root]) {
    for (int32_t id : Expand(Node(start, kAccept))) {
      if (seen_[id] != stamp) {
        seen_[id] = stamp;
        state_.stacks.push_back(id);
      }
    }
    if (!status_.ok()) break;
  }
  if (state_.stacks.size() > kMaxStacksPerState && status_.ok()) {
    status_ = ResourceExhausted("the grammar is too ambiguous to follow (over {} stacks at once)", kMaxStacksPerState);
  }
}

namespace {
// Units between looks at the clock (a few hundred microseconds of work).
constexpr int64_t kWorkChunk = int64_t{1} << 16;
}  // namespace

void GrammarMatcher::BeginCall() {
  work_left_ = std::min(kWorkChunk, kMaxWorkPerCall);
  work_reserve_ = kMaxWorkPerCall - work_left_;
}

bool GrammarMatcher::Refill() {
  if (!status_.ok()) return false;
  if (work_reserve_ <= 0) {
    status_ = ResourceExhausted("the grammar is too ambiguous to follow (one token took over {} steps of work)", kMaxWorkPerCall);
    return false;
  }
  if (deadline_ != Clock::time_point::max() && Clock::now() > deadline_) {
    status_ = ResourceExhausted("the grammar is too ambiguous to follow (its first state took longer than the time limit)");
    return false;
  }
  const int64_t n = std::min(kWorkChunk, work_reserve_);
  work_reserve_ -= n;
  work_left_ += n;
  return work_left_ >= 0 || Refill();
}

int32_t GrammarMatcher::Node(int32_t pos, int32_t parent) {
  // An alternative's end continues at the parent: no node for it, so right recursion (a ::= x a)
  // does not grow the stack.
  if (g_->elements[pos].kind == Element::Kind::kEnd) return parent;
  const uint64_t key = (static_cast<uint64_t>(static_cast<uint32_t>(pos)) << 32) | static_cast<uint32_t>(parent);
  if (const int64_t found = node_ids_.Find(key); found >= 0) return static_cast<int32_t>(found);
  if (static_cast<int64_t>(nodes_.size()) >= kMaxMatcherNodes) {
    // Past the limit nothing more is built: the matcher is dead from here (status_), and the
    // id returned only has to be valid.
    if (status_.ok()) {
      status_ = ResourceExhausted("the grammar is too ambiguous to follow (over {} parser stacks)", kMaxMatcherNodes);
    }
    return kAccept;
  }
  // A new node costs about four times a walked one (the hash table and six per-node tables).
  if (!Spend(4)) return kAccept;
  const int32_t id = static_cast<int32_t>(nodes_.size());
  node_ids_.Insert(key, id);
  AppendNode(pos, parent);
  return id;
}

namespace {
size_t SlotOf(uint64_t key, size_t mask) {
  // A 64-bit mix (the keys' low bits are the parent, high bits the position).
  key ^= key >> 33;
  key *= 0xff51afd7ed558ccdull;
  key ^= key >> 33;
  return static_cast<size_t>(key) & mask;
}
}  // namespace

int64_t GrammarMatcher::NodeIds::Find(uint64_t key) const {
  if (keys.empty()) return -1;
  const size_t mask = keys.size() - 1;
  for (size_t i = SlotOf(key, mask);; i = (i + 1) & mask) {
    if (keys[i] == key) return ids[i];
    if (keys[i] == kEmpty) return -1;
  }
}

void GrammarMatcher::NodeIds::Insert(uint64_t key, int32_t id) {
  if (2 * (size + 1) > keys.size()) {
    std::vector<uint64_t> old_keys(std::max<size_t>(64, 2 * keys.size()), kEmpty);
    std::vector<int32_t> old_ids(old_keys.size(), -1);
    old_keys.swap(keys);
    old_ids.swap(ids);
    size = 0;
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != kEmpty) Insert(old_keys[i], old_ids[i]);
    }
  }
  const size_t mask = keys.size() - 1;
  size_t i = SlotOf(key, mask);
  while (keys[i] != kEmpty) i = (i + 1) & mask;
  keys[i] = key;
  ids[i] = id;
  ++size;
}

void GrammarMatcher::AppendNode(int32_t pos, int32_t parent) {
  nodes_.push_back({pos, parent});
  expand_.emplace_back();
  successors_.emplace_back();
  have_expand_.push_back(0);
  have_successors_.push_back(0);
  seen_.push_back(0);
  visit_.push_back(0);
}

const std::vector<int32_t>& GrammarMatcher::Expand(int32_t id) {
  if (have_expand_[id]) return expand_[id];
  // Iterative (a chain of rules that each start with the next can be long); every node is
  // visited once per expansion.
  std::vector<int32_t> out;
  const uint32_t stamp = ++visit_stamp_;
  work_.clear();
  work_.push_back(id);
  visit_[id] = stamp;
  while (!work_.empty()) {
    const int32_t n = work_.back();
    work_.pop_back();
    if (n == kAccept || g_->elements[nodes_[n].pos].terminal()) {
      out.push_back(n);
      continue;
    }
    const StackNode sn = nodes_[n];
    const int32_t cont = Node(sn.pos + 1, sn.parent);
    const auto& alts = g_->alternatives[g_->elements[sn.pos].index];
    if (!Spend(1 + static_cast<int64_t>(alts.size()))) break;
    // Pushed in reverse so alternatives come out in order (states are deterministic either way).
    for (auto a = alts.rbegin(); a != alts.rend(); ++a) {
      const int32_t m = Node(*a, cont);
      if (visit_[m] != stamp) {
        visit_[m] = stamp;
        work_.push_back(m);
      }
    }
  }
  // NOTE: an expansion cut short by a limit is kept too: the matcher is dead from then on.
  have_expand_[id] = 1;
  expand_[id] = std::move(out);
  return expand_[id];
}

const std::vector<int32_t>& GrammarMatcher::Successors(int32_t id) {
  if (have_successors_[id]) return successors_[id];
  const StackNode sn = nodes_[id];
  const int32_t next = Node(sn.pos + 1, sn.parent);
  std::vector<int32_t> out = Expand(next);  // copy: Expand's storage may move as nodes are added
  have_successors_[id] = 1;
  successors_[id] = std::move(out);
  return successors_[id];
}

void GrammarMatcher::AdvanceCodePoint(const std::vector<int32_t>& in, uint32_t cp, std::vector<int32_t>* out) {
  out->clear();
  const uint32_t stamp = ++seen_stamp_;
  if (!Spend(static_cast<int64_t>(in.size()))) return;
  for (int32_t id : in) {
    if (id == kAccept || g_->elements[nodes_[id].pos].kind != Element::Kind::kChars) continue;
    const CharSet& set = g_->char_sets[g_->elements[nodes_[id].pos].index];
    if (!set.Contains(cp)) continue;
    const std::vector<int32_t>& next = Successors(id);
    if (!Spend(static_cast<int64_t>(next.size()))) return;
    for (int32_t n : next) {
      if (seen_[n] != stamp) {
        seen_[n] = stamp;
        out->push_back(n);
      }
    }
  }
  if (out->size() > kMaxStacksPerState && status_.ok()) {
    status_ = ResourceExhausted("the grammar is too ambiguous to follow (over {} stacks at once)", kMaxStacksPerState);
  }
}

bool GrammarMatcher::AdvanceByte(const State& in, uint8_t byte, State* out) {
  if (!status_.ok()) return false;
  if (in.remaining == 0) {
    if (byte < 0x80) {
      out->partial = 0;
      out->remaining = 0;
      AdvanceCodePoint(in.stacks, byte, &out->stacks);
      return !out->stacks.empty() && status_.ok();
    }
    int len = (byte >> 5) == 6 ? 2 : (byte >> 4) == 14 ? 3 : (byte >> 3) == 30 ? 4 : 0;
    if (len == 0) return false;  // a continuation byte or 0xF8.. cannot start a character
    out->partial = len == 2 ? (byte & 0x1F) : len == 3 ? (byte & 0x0F) : (byte & 0x07);
    out->remaining = len - 1;
    out->length = len;
  } else {
    if ((byte & 0xC0) != 0x80) return false;
    out->partial = (in.partial << 6) | (byte & 0x3F);
    out->remaining = in.remaining - 1;
    out->length = in.length;
    if (out->remaining == 0) {
      const uint32_t cp = out->partial;
      out->partial = 0;
      out->length = 0;
      // Overlong forms, surrogates and values past Unicode are not characters.
      if (cp > 0x10FFFF || cp < kMinCodePoint[in.length] || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
      AdvanceCodePoint(in.stacks, cp, &out->stacks);
      return !out->stacks.empty() && status_.ok();
    }
  }
  // Unfinished: keep the stacks that some completion of the character could advance.
  const int shift = 6 * out->remaining;
  const uint32_t lo = std::max(out->partial << shift, kMinCodePoint[out->length]);
  const uint32_t hi = std::min<uint32_t>((out->partial << shift) | ((1u << shift) - 1), 0x10FFFF);
  if (lo > hi) return false;
  // The characters this prefix can still become: [lo, hi] without the surrogates (a stack that
  // only a surrogate would advance must not survive, or the state ends up with no way on).
  const bool below = lo < 0xD800, above = hi > 0xDFFF;
  if (!below && !above) return false;
  out->stacks.clear();
  if (!Spend(static_cast<int64_t>(in.stacks.size()))) return false;
  for (int32_t id : in.stacks) {
    if (id == kAccept || g_->elements[nodes_[id].pos].kind != Element::Kind::kChars) continue;
    const CharSet& set = g_->char_sets[g_->elements[nodes_[id].pos].index];
    if ((below && set.Intersects(lo, std::min<uint32_t>(hi, 0xD7FF))) || (above && set.Intersects(std::max<uint32_t>(lo, 0xE000), hi))) {
      out->stacks.push_back(id);
    }
  }
  return !out->stacks.empty();
}

bool GrammarMatcher::Step(const State& in, int32_t token, State* out) {
  if (!status_.ok()) return false;
  const TokenTrie& trie = grammar_->trie();
  if (token < 0 || token >= trie.vocab_size()) return false;
  // Its text, byte by byte (tokens a text can be: not control tokens).
  bool by_text = false;
  if (trie.usable(token)) {
    const std::string& bytes = trie.bytes(token);
    const State* cur = &in;
    by_text = true;
    for (size_t i = 0; i < bytes.size() && by_text; ++i) {
      State* next = &scratch_[i & 1];
      by_text = AdvanceByte(*cur, static_cast<uint8_t>(bytes[i]), next);
      cur = next;
    }
    if (by_text) *out = *cur;
  }
  if (!status_.ok()) return false;
  // As itself, where a stack's top asks for exactly this token (<[N]>), between characters.
  if (in.remaining != 0) return by_text;
  const uint32_t stamp = ++seen_stamp_;
  if (by_text) {
    for (int32_t id : out->stacks) seen_[id] = stamp;
  } else {
    out->stacks.clear();
    out->partial = 0;
    out->remaining = 0;
    out->length = 0;
  }
  bool by_token = false;
  if (!Spend(static_cast<int64_t>(in.stacks.size()))) return false;
  for (int32_t id : in.stacks) {
    if (id == kAccept) continue;
    const Element& e = g_->elements[nodes_[id].pos];
    if (e.kind != Element::Kind::kToken || e.index != token) continue;
    by_token = true;
    for (int32_t n : Successors(id)) {
      if (seen_[n] != stamp) {
        seen_[n] = stamp;
        out->stacks.push_back(n);
      }
    }
  }
  return (by_text || by_token) && status_.ok();
}

bool GrammarMatcher::IsStop(int32_t token) const {
  return std::find(stop_tokens_.begin(), stop_tokens_.end(), token) != stop_tokens_.end();
}

bool GrammarMatcher::Allows(int32_t token) {
  if (!status_.ok()) return false;
  if (IsStop(token)) return CanEnd();
  BeginCall();
  return Step(state_, token, &step_);
}

size_t GrammarMatcher::AllowedPrefix(std::span<const int32_t> tokens) {
  if (!status_.ok()) return 0;
  State walk[2];
  walk[0] = state_;
  int cur = 0;
  for (size_t k = 0; k < tokens.size(); ++k) {
    const int32_t t = tokens[k];
    if (IsStop(t)) {
      const State& s = walk[cur];
      const bool can_end = s.remaining == 0 && std::find(s.stacks.begin(), s.stacks.end(), kAccept) != s.stacks.end();
      return can_end ? k + 1 : k;  // nothing follows a stop token
    }
    BeginCall();
    if (!Step(walk[cur], t, &walk[cur ^ 1])) return k;
    cur ^= 1;
  }
  return tokens.size();
}

Status GrammarMatcher::Accept(int32_t token) {
  RETURN_IF_ERROR(status_);
  if (!Allows(token)) {
    RETURN_IF_ERROR(status_);
    return InvalidArgument("token {} does not continue the grammar here", token);
  }
  if (IsStop(token)) return Status::Ok();
  std::swap(state_, step_);
  text_mask_.reset();
  mask_.reset();
  return Status::Ok();
}

bool GrammarMatcher::CanEnd() const {
  return state_.remaining == 0 && std::find(state_.stacks.begin(), state_.stacks.end(), kAccept) != state_.stacks.end();
}

bool GrammarMatcher::Done() const { return state_.remaining == 0 && state_.stacks.size() == 1 && state_.stacks[0] == kAccept; }

std::vector<int32_t> GrammarMatcher::Key() {
  // Each stack as the positions from its top down, stacks sorted: the same content gives the
  // same key in every matcher of this grammar.
  std::vector<std::vector<int32_t>> stacks;
  stacks.reserve(state_.stacks.size());
  for (int32_t id : state_.stacks) {
    std::vector<int32_t> s;
    for (int32_t n = id; n != kAccept; n = nodes_[n].parent) s.push_back(nodes_[n].pos);
    if (!Spend(1 + static_cast<int64_t>(s.size()))) return {};
    stacks.push_back(std::move(s));
  }
  std::sort(stacks.begin(), stacks.end());
  std::vector<int32_t> key = {static_cast<int32_t>(state_.partial), state_.remaining, state_.length};
  for (const auto& s : stacks) {
    key.insert(key.end(), s.begin(), s.end());
    key.push_back(-1);
  }
  return key;
}

std::shared_ptr<TokenMask> GrammarMatcher::ComputeMask() {
  const TokenTrie& trie = grammar_->trie();
  auto mask = std::make_shared<TokenMask>((static_cast<size_t>(trie.vocab_size()) + 63) / 64, 0);
  const auto& nodes = trie.nodes();
  const auto& tokens = trie.tokens();
  walk_.resize(static_cast<size_t>(trie.max_depth()) + 1);
  walk_[0] = state_;
  for (size_t i = 1; i < nodes.size() && status_.ok();) {
    const TokenTrie::Node& n = nodes[i];
    if (!Spend(1) || !AdvanceByte(walk_[n.depth - 1], n.byte, &walk_[n.depth])) {
      i += static_cast<size_t>(n.subtree);  // no token with this prefix can continue
      continue;
    }
    for (int32_t k = n.token_begin; k < n.token_end; ++k) {
      const int32_t t = tokens[k];
      (*mask)[t >> 6] |= uint64_t{1} << (t & 63);
    }
    ++i;
  }
  // Tokens the grammar names (<[N]>) where a stack's top asks for them.
  if (state_.remaining == 0) {
    for (int32_t id : state_.stacks) {
      if (id == kAccept) continue;
      const Element& e = g_->elements[nodes_[id].pos];
      if (e.kind == Element::Kind::kToken && e.index < trie.vocab_size()) (*mask)[e.index >> 6] |= uint64_t{1} << (e.index & 63);
    }
  }
  return mask;
}

std::shared_ptr<const TokenMask> GrammarMatcher::TextMask() {
  if (text_mask_) return text_mask_;
  BeginCall();
  const std::vector<int32_t> key = Key();
  if (status_.ok()) text_mask_ = grammar_->Find(key);
  if (!text_mask_) {
    auto m = ComputeMask();
    // A mask cut short by a limit is incomplete: not for the cache.
    if (status_.ok()) grammar_->Insert(key, m);
    text_mask_ = std::move(m);
  }
  return text_mask_;
}

std::shared_ptr<const TokenMask> GrammarMatcher::Mask() {
  if (mask_) return mask_;
  std::shared_ptr<const TokenMask> text = TextMask();
  const int32_t vocab = grammar_->trie().vocab_size();
  // Stop tokens end the text: allowed exactly where the grammar may end, whatever their bytes.
  bool changes = false;
  const bool can_end = CanEnd();
  for (int32_t t : stop_tokens_) {
    if (t >= 0 && t < vocab && (((*text)[t >> 6] >> (t & 63)) & 1) != static_cast<uint64_t>(can_end)) changes = true;
  }
  if (!changes) return mask_ = std::move(text);
  auto m = std::make_shared<TokenMask>(*text);
  for (int32_t t : stop_tokens_) {
    if (t < 0 || t >= vocab) continue;
    if (can_end) {
      (*m)[t >> 6] |= uint64_t{1} << (t & 63);
    } else {
      (*m)[t >> 6] &= ~(uint64_t{1} << (t & 63));
    }
  }
  return mask_ = std::move(m);
}

bool GrammarMatcher::MaskLogits(std::span<float> logits) {
  const TokenMask& m = *TextMask();
  if (!status_.ok()) return false;
  // Stop tokens are decided apart (allowed exactly where the grammar may end): their logits are
  // kept aside and put back, or not, after the text mask.
  const size_t vocab = std::min(logits.size(), static_cast<size_t>(grammar_->trie().vocab_size()));
  const bool can_end = CanEnd();
  std::vector<std::pair<int32_t, float>> stops;
  for (int32_t t : stop_tokens_) {
    if (t >= 0 && static_cast<size_t>(t) < vocab) stops.emplace_back(t, logits[t]);
  }
  // Allowed tokens that are not stop tokens; each stop token the text mask allows is taken off.
  int64_t allowed = 0;
  for (const auto& [t, l] : stops) allowed -= static_cast<int64_t>((m[t >> 6] >> (t & 63)) & 1);
  // Word by word: a JSON state allows either almost everything (inside a string) or almost
  // nothing (between tokens), so most words are all ones or all zeros.
  for (size_t w = 0; w * 64 < vocab; ++w) {
    const uint64_t bits = m[w];
    const size_t begin = w * 64, end = std::min(vocab, begin + 64);
    if (bits == ~uint64_t{0} && end - begin == 64) {
      allowed += 64;
    } else if (bits == 0) {
      std::fill(logits.begin() + begin, logits.begin() + end, -INFINITY);
    } else {
      for (size_t t = begin; t < end; ++t) {
        if ((bits >> (t - begin)) & 1) {
          ++allowed;
        } else {
          logits[t] = -INFINITY;
        }
      }
    }
  }
  std::fill(logits.begin() + vocab, logits.end(), -INFINITY);  // padding past the tokenizer's
  for (const auto& [t, l] : stops) logits[t] = can_end ? l : -INFINITY;
  return allowed > 0 || (can_end && !stops.empty());
}

}  // namespace gale::grammar
