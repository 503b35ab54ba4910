// API keys for `gale serve`: from the flag, a file (one key per line, so that no key need appear
// on a command line, where `ps` shows it) or the GALE_API_KEY environment variable, and the check
// of a request's key against them in time that does not depend on where a guess first differs.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace gale::server {

// The keys of a file: one per line, surrounding blanks trimmed, blank lines and lines starting
// with '#' skipped. Errors for an unreadable file, one without keys, or a key holding blanks or
// control characters (it could not be sent in a header).
StatusOr<std::vector<std::string>> ReadApiKeyFile(const std::string& path);

// Every key the server accepts: the flags' keys, the file's, and env_key (GALE_API_KEY's value,
// when set) when neither a flag nor a file gives one. Checked as ReadApiKeyFile checks a line.
StatusOr<std::vector<std::string>> ResolveApiKeys(const std::vector<std::string>& flag_keys, const std::string& key_file,
                                                  std::optional<std::string> env_key);

// Whether `given` is one of the keys (no key configured: every request passes).
bool ApiKeyMatches(const std::vector<std::string>& keys, std::string_view given);

}  // namespace gale::server
