#include "server/api_keys.h"

#include <fstream>
#include <sstream>

namespace gale::server {
namespace {

Status CheckKey(std::string_view key, std::string_view from) {
  if (key.empty()) return InvalidArgument("{}: an API key may not be empty", from);
  for (unsigned char c : key) {
    if (c <= 0x20 || c == 0x7f) {
      return InvalidArgument("{}: an API key may not hold blanks or control characters", from);
    }
  }
  return Status::Ok();
}

std::string_view Trim(std::string_view s) {
  auto blank = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; };
  while (!s.empty() && blank(s.front())) s.remove_prefix(1);
  while (!s.empty() && blank(s.back())) s.remove_suffix(1);
  return s;
}

}  // namespace

StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return InvalidArgument("--api-key-file {}: cannot be read", path);
  std::vector<std::string> keys;
  std::string line;
  int64_t number = 0;
  while (std::getline(f, line)) {
    ++number;
    const std::string_view key = Trim(line);
    if (key.empty() || key.front() == '#') continue;
    RETURN_IF_ERROR(CheckKey(key, fmt::format("--api-key-file {} line {}", path, number)));
    keys.emplace_back(key);
  }
  if (keys.empty()) return InvalidArgument("--api-key-file {}: holds no key", path);
  return keys;
}

StatusOr<std::vector<std::string>> ResolveApiKeys(const std::vector<std::string>& flag_keys, const std::string& key_file,
                                                  std::optional<std::string> env_key) {
  std::vector<std::string> keys;
  for (const std::string& k : flag_keys) {
    RETURN_IF_ERROR(CheckKey(k, "--api-key"));
    keys.push_back(k);
  }
  if (!key_file.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::string> from_file, ReadApiKeyFile(key_file));
    keys.insert(keys.end(), from_file.begin(), from_file.end());
  }
  if (keys.empty() && env_key.has_value()) {
    const std::string_view key = Trim(*env_key);
    RETURN_IF_ERROR(CheckKey(key, "GALE_API_KEY"));
    keys.emplace_back(key);
  }
  return keys;
}

bool ApiKeyMatches(const std::vector<std::string>& keys, std::string_view given) {
  if (keys.empty()) return true;
  bool match = false;
  for (const std::string& k : keys) {
    // Every byte compared whatever the others are; only the lengths' equality shows in the time.
    unsigned char diff = k.size() == given.size() ? 0 : 1;
    for (size_t i = 0; i < k.size(); ++i) diff |= static_cast<unsigned char>(k[i] ^ (i < given.size() ? given[i] : 0));
    match = match || diff == 0;
  }
  return match;
}

}  // namespace gale::server
