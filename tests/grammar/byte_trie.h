// Test helpers for grammars: a vocabulary of the 256 single bytes (each token one byte), so that
// a text is a sentence of a grammar exactly when its bytes are accepted one by one.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace gale::test {

inline std::shared_ptr<const grammar::TokenTrie> ByteTrie() {
  static auto trie = [] {
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    return std::make_shared<const grammar::TokenTrie>(bytes, std::vector<bool>(256, true));
  }();
  return trie;
}

// Whether the whole text is a sentence of the compiled grammar (over ByteTrie()).
inline bool AcceptsText(std::shared_ptr<const grammar::CompiledGrammar> g, const std::string& text) {
  grammar::GrammarMatcher m(std::move(g), {});
  for (unsigned char b : text) {
    if (!m.Accept(b).ok()) return false;
  }
  return m.CanEnd();
}

}  // namespace gale::test
