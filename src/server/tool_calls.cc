// Tool-call parsers per family, the streaming splitter, and the tool-call grammar.
#include "server/tool_calls.h"

#include <algorithm>
#include <span>

#include <fmt/format.h>

#include "grammar/compiler.h"
#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "jinja/value.h"

namespace gale::server {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kHermesOpen = "<tool_call>", kHermesClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]", kMistralArgs = "[ARGS]";
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>", kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>", kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kKimiCallsBegin = "<|tool_calls_section_begin|>", kKimiCallsEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kKimiCallBegin = "<|tool_call_begin|>", kKimiCallEnd = "<|tool_call_end|>";
constexpr std::string_view kKimiArgs = "<|tool_call_argument_begin|>";
constexpr std::string_view kXmlFunction = "<function=";
constexpr std::string_view kGlmKey = "<arg_key>", kGlmKeyEnd = "</arg_key>";
constexpr std::string_view kGlmValue = "<arg_value>", kGlmValueEnd = "</arg_value>";
constexpr std::string_view kMinimaxOpen = "<minimax:tool_call>", kMinimaxClose = "</minimax:tool_call>";
constexpr std::string_view kInvoke = "<invoke name=", kInvokeEnd = "</invoke>";
constexpr std::string_view kNamedParam = "<parameter name=", kParamEnd = "</parameter>";
constexpr std::string_view kGemmaCallOpen = "<|tool_call>", kGemmaCall = "<|tool_call>call:", kGemmaCallEnd = "<tool_call|>";
constexpr std::string_view kGemmaQuote = "<|\"|>", kGemmaResponse = "<|tool_response>";
constexpr int kMaxArgumentDepth = 64;

std::string_view Trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

bool StartsWith(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// Where the JSON object or array starting at s[start] ends (one past its closing bracket), or
// npos when it does not close.
size_t JsonValueEnd(std::string_view s, size_t start) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = start; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if (c == '}' || c == ']') {
      if (--depth == 0) return i + 1;
    }
  }
  return std::string_view::npos;
}

std::optional<Json> ParseJson(std::string_view text) {
  Json j = Json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || jinja::JsonDeeperThan(j, kMaxArgumentDepth)) return std::nullopt;
  return j;
}

bool IsJsonSpace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && IsJsonSpace(s[i])) ++i;
  return i;
}

// Follows a JSON value a character at a time (a stream's arguments, as the model writes them):
// appends c to out, and says false once the value has closed.
struct JsonScanState {
  bool in_string = false, escape = false;
  int depth = 0;
};
bool JsonScanStep(JsonScanState* m, char c, std::string* out) {
  *out += c;
  if (m->in_string) {
    if (m->escape) {
      m->escape = false;
    } else if (c == '\\') {
      m->escape = true;
    } else if (c == '"') {
      m->in_string = false;
    }
    return true;
  }
  if (c == '"') {
    m->in_string = true;
  } else if (c == '{' || c == '[') {
    ++m->depth;
  } else if (c == '}' || c == ']') {
    return --m->depth > 0;
  }
  return true;
}

// Arguments as OpenAI wants them: a JSON object, as text, as the model wrote it (so a stream can
// send it as it is written, and the whole is the same text). A string holding an object (models
// sometimes encode twice) is taken apart once.
std::optional<std::string> ArgumentsText(std::string_view raw) {
  raw = Trim(raw);
  auto j = ParseJson(raw);
  if (!j) return std::nullopt;
  if (j->is_object()) return std::string(raw);
  if (j->is_string()) {
    const std::string inner = j->get<std::string>();
    auto o = ParseJson(inner);
    if (o && o->is_object()) return std::string(Trim(inner));
  }
  return std::nullopt;
}

// Where the JSON value at s[i] ends (one past it), or npos when it does not end within s.
size_t ValueEnd(std::string_view s, size_t i) {
  if (i >= s.size()) return std::string_view::npos;
  if (s[i] == '{' || s[i] == '[') return JsonValueEnd(s, i);
  if (s[i] == '"') {
    for (size_t j = i + 1; j < s.size(); ++j) {
      if (s[j] == '\\') {
        ++j;
      } else if (s[j] == '"') {
        return j + 1;
      }
    }
    return std::string_view::npos;
  }
  size_t j = i;
  while (j < s.size() && !IsJsonSpace(s[j]) && s[j] != ',' && s[j] != '}' && s[j] != ']') ++j;
  return j == i ? std::string_view::npos : j;
}

// The text of a valid JSON object's member `key` (the last one of that name), as written.
std::optional<std::string_view> MemberText(std::string_view obj, std::string_view key) {
  std::optional<std::string_view> found;
  size_t i = SkipSpace(obj, 0);
  if (i >= obj.size() || obj[i] != '{') return std::nullopt;
  i = SkipSpace(obj, i + 1);
  while (i < obj.size() && obj[i] == '"') {
    const size_t key_end = ValueEnd(obj, i);
    if (key_end == std::string_view::npos) return found;
    const std::string_view k = obj.substr(i + 1, key_end - i - 2);
    i = SkipSpace(obj, key_end);
    if (i >= obj.size() || obj[i] != ':') return found;
    i = SkipSpace(obj, i + 1);
    const size_t value_end = ValueEnd(obj, i);
    if (value_end == std::string_view::npos) return found;
    if (k == key) found = obj.substr(i, value_end - i);
    i = SkipSpace(obj, value_end);
    if (i < obj.size() && obj[i] == ',') i = SkipSpace(obj, i + 1);
  }
  return found;
}

// {"name": ..., "arguments" | "parameters": {...}} (parameters if both); need_args: without
// either key it is no call.
std::optional<ToolCall> CallFromText(std::string_view text, bool need_args = false) {
  text = Trim(text);
  auto j = ParseJson(text);
  if (!j || !j->is_object() || !j->contains("name") || !(*j)["name"].is_string() ||
      (*j)["name"].get<std::string>().empty()) {
    return std::nullopt;
  }
  std::optional<std::string_view> args = MemberText(text, "parameters");
  if (!args) args = MemberText(text, "arguments");
  if (!args) {
    if (need_args) return std::nullopt;
    return ToolCall{(*j)["name"].get<std::string>(), "{}", ""};
  }
  auto a = ArgumentsText(*args);
  if (!a) return std::nullopt;
  return ToolCall{(*j)["name"].get<std::string>(), *a, ""};
}

// A Python literal (what a model trained on Python writes for a dict: single quotes, True, None)
// as JSON, or nothing when it is not one.
std::optional<Json> PythonLiteral(std::string_view text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    const char c = text[i];
    if (c == '\'' || c == '"') {
      std::string str;
      size_t j = i + 1;
      for (; j < text.size() && text[j] != c; ++j) {
        if (text[j] == '\\' && j + 1 < text.size()) {
          const char e = text[++j];
          str += e == 'n' ? '\n' : e == 't' ? '\t' : e;
        } else {
          str += text[j];
        }
      }
      if (j >= text.size()) return std::nullopt;
      out += JsonText(Json(str));
      i = j + 1;
    } else if (std::isalpha(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < text.size() && std::isalnum(static_cast<unsigned char>(text[j]))) ++j;
      const std::string_view word = text.substr(i, j - i);
      if (word == "True") {
        out += "true";
      } else if (word == "False") {
        out += "false";
      } else if (word == "None") {
        out += "null";
      } else {
        return std::nullopt;
      }
      i = j;
    } else {
      out += c;
      ++i;
    }
  }
  return ParseJson(out);
}

// One Qwen3-Coder parameter value (text) as JSON, by the type its tool declares ("" unknown): a
// string parameter's value is its text; others are JSON (or a Python literal for an object or an
// array); an undeclared one is JSON where it parses as a non-string, else its text.
Json XmlValue(std::string_view value, std::string_view type) {
  if (type == "string") return Json(std::string(value));
  if (auto j = ParseJson(value); j && !j->is_string()) return *j;
  const std::string_view t = Trim(value);
  if ((type == "object" || type == "array" || type.empty()) && (StartsWith(t, "{") || StartsWith(t, "["))) {
    if (auto j = PythonLiteral(t)) return *j;
  }
  if (type == "boolean" && (t == "True" || t == "False")) return Json(t == "True");
  return Json(std::string(value));
}

// Qwen3-Coder's XML: <function=NAME> <parameter=P>VALUE</parameter>... </function>, each value
// converted by its declared type (XmlValue). A value missing its </parameter> ends where the next
// parameter or the function does.
std::optional<ToolCall> CallFromXml(std::string_view text, const ToolParamTypes* types) {
  text = Trim(text);
  if (!StartsWith(text, "<function=")) return std::nullopt;
  const size_t name_end = text.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  ToolCall call{std::string(Trim(text.substr(10, name_end - 10))), "", ""};
  const std::map<std::string, std::string>* declared = nullptr;
  if (types != nullptr) {
    if (auto it = types->find(call.name); it != types->end()) declared = &it->second;
  }
  const size_t fn_end = text.rfind("</function>");
  if (call.name.empty() || fn_end == std::string_view::npos || fn_end < name_end) return std::nullopt;
  Json args = Json::object();
  size_t pos = name_end + 1;
  while (true) {
    const size_t p = text.find("<parameter=", pos);
    if (p == std::string_view::npos || p > fn_end) break;
    const size_t key_end = text.find('>', p);
    if (key_end == std::string_view::npos || key_end > fn_end) return std::nullopt;
    const size_t closed = text.find("</parameter>", key_end);
    const size_t next = std::min({closed, text.find("<parameter=", key_end), fn_end});
    const std::string key(Trim(text.substr(p + 11, key_end - p - 11)));
    std::string_view value = text.substr(key_end + 1, next - key_end - 1);
    if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
    if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
    std::string type;
    if (declared != nullptr) {
      if (auto it = declared->find(key); it != declared->end()) type = it->second;
    }
    args[key] = XmlValue(value, type);
    pos = next == closed ? closed + 12 : next;
  }
  call.arguments = JsonText(args);
  return call;
}

void AppendContent(std::string* content, std::string_view text) { content->append(text); }

ParsedMessage ParseTagged(std::string_view text, bool xml, const ToolParamTypes* types) {
  ParsedMessage out;
  size_t pos = 0;
  while (true) {
    const size_t start = text.find(kHermesOpen, pos);
    // Qwen3-Coder's <function=...> without the <tool_call> around it (a stray </tool_call> after
    // it goes with it).
    const size_t bare = xml ? text.find(kXmlFunction, pos) : std::string_view::npos;
    if (bare < start) {
      AppendContent(&out.content, text.substr(pos, bare - pos));
      const size_t end = text.find("</function>", bare);
      if (end == std::string_view::npos) {
        pos = bare;
        break;
      }
      size_t next = end + 11;
      const std::string_view after = Trim(text.substr(next));
      if (StartsWith(after, kHermesClose)) next = text.size() - after.size() + kHermesClose.size();
      if (auto call = CallFromXml(text.substr(bare, end + 11 - bare), types)) {
        out.calls.push_back(std::move(*call));
      } else {
        AppendContent(&out.content, text.substr(bare, next - bare));
      }
      pos = next;
      continue;
    }
    if (start == std::string_view::npos) break;
    AppendContent(&out.content, text.substr(pos, start - pos));
    const size_t inner_begin = start + kHermesOpen.size();
    // The closing tag after the call's JSON (a string inside it may hold the tag's text).
    size_t json_start = inner_begin;
    while (json_start < text.size() && (text[json_start] == ' ' || text[json_start] == '\n' || text[json_start] == '\r' || text[json_start] == '\t')) ++json_start;
    const size_t json_end = json_start < text.size() && text[json_start] == '{' ? JsonValueEnd(text, json_start) : std::string_view::npos;
    const size_t close = text.find(kHermesClose, json_end == std::string_view::npos ? start : json_end);
    const size_t inner_end = close == std::string_view::npos ? text.size() : close;
    const size_t next = close == std::string_view::npos ? text.size() : close + kHermesClose.size();
    const std::string_view inner = text.substr(inner_begin, inner_end - inner_begin);
    // Qwen3-Coder writes XML, but JSON inside the tags (what its constrained form writes) is a call too.
    std::optional<ToolCall> call = xml ? CallFromXml(inner, types) : std::nullopt;
    if (!call) call = CallFromText(inner);
    if (call) {
      out.calls.push_back(std::move(*call));
    } else {
      AppendContent(&out.content, text.substr(start, next - start));  // malformed: left as text
    }
    pos = next;
  }
  AppendContent(&out.content, text.substr(pos));
  return out;
}

// One or more JSON objects (llama3_json: joined by ';'), or one JSON array of them (mistral);
// everything or nothing.
std::optional<std::vector<ToolCall>> JsonCalls(std::string_view text, bool need_args = false) {
  std::vector<ToolCall> calls;
  size_t pos = 0;
  text = Trim(text);
  if (StartsWith(text, "[")) {
    auto j = ParseJson(text);
    if (!j || !j->is_array() || j->empty()) return std::nullopt;
    // Each element as written.
    for (size_t i = SkipSpace(text, 1); i < text.size() && text[i] != ']';) {
      const size_t end = ValueEnd(text, i);
      auto c = CallFromText(text.substr(i, end - i), need_args);
      if (!c) return std::nullopt;
      calls.push_back(std::move(*c));
      i = SkipSpace(text, end);
      if (i < text.size() && text[i] == ',') i = SkipSpace(text, i + 1);
    }
    return calls;
  }
  while (pos < text.size()) {
    if (text[pos] != '{') return std::nullopt;
    const size_t end = JsonValueEnd(text, pos);
    if (end == std::string_view::npos) return std::nullopt;
    auto c = CallFromText(text.substr(pos, end - pos), need_args);
    if (!c) return std::nullopt;
    calls.push_back(std::move(*c));
    pos = end;
    while (pos < text.size() && (text[pos] == ';' || text[pos] == ' ' || text[pos] == '\n' || text[pos] == '\t')) ++pos;
  }
  if (calls.empty()) return std::nullopt;
  return calls;
}

ParsedMessage ParseLlama3(std::string_view text) {
  ParsedMessage out;
  std::string_view body = Trim(text);
  if (StartsWith(body, kPythonTag)) body = Trim(body.substr(kPythonTag.size()));
  if (StartsWith(body, "{")) {
    if (auto calls = JsonCalls(body, /*need_args=*/true)) {
      out.calls = std::move(*calls);
      return out;
    }
  }
  // Calls written inside prose ("Here is the result: {...}"), as vLLM's parser takes them: every
  // object with a name and parameters is a call, and the prose around them goes.
  for (size_t at = body.find('{'); at != std::string_view::npos; at = body.find('{', at + 1)) {
    const size_t end = JsonValueEnd(body, at);
    if (end == std::string_view::npos) break;
    if (auto c = CallFromText(body.substr(at, end - at), /*need_args=*/true)) {
      out.calls.push_back(std::move(*c));
      at = end - 1;
    }
  }
  if (out.calls.empty()) out.content = std::string(text);
  return out;
}

// Mistral. v11 and later: [TOOL_CALLS]NAME[ARGS]{...} (the decoder may drop [ARGS], a control
// token), one per [TOOL_CALLS]; arguments that are not valid JSON (cut off) come back as written,
// and a name without arguments is no call. Earlier: [TOOL_CALLS] [{"name", "arguments"}, ...],
// the array found past any junk. Text after the calls goes, as vLLM's parser drops it.
ParsedMessage ParseMistral(std::string_view text) {
  ParsedMessage out;
  const size_t marker = text.find(kMistralCalls);
  if (marker == std::string_view::npos) {
    // The marker is a control token, often absent from the text: a bare leading array of calls.
    if (StartsWith(Trim(text), "[{")) {
      if (auto calls = JsonCalls(text)) {
        out.calls = std::move(*calls);
        return out;
      }
    }
    out.content = std::string(text);
    return out;
  }
  out.content = std::string(text.substr(0, marker));
  std::string_view rest = Trim(text.substr(marker + kMistralCalls.size()));
  const auto name_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; };
  if (!rest.empty() && std::all_of(rest.begin(), rest.end(), name_char)) return out;  // a name alone: no call
  if (!rest.empty() && name_char(rest.front())) {
    std::string_view calls = rest;
    while (!calls.empty()) {
      size_t n = 0;
      while (n < calls.size() && name_char(calls[n])) ++n;
      const std::string name(calls.substr(0, n));
      std::string_view args = Trim(calls.substr(n));
      if (StartsWith(args, kMistralArgs)) args = Trim(args.substr(kMistralArgs.size()));
      if (name.empty() || !StartsWith(args, "{")) break;
      const size_t end = JsonValueEnd(args, 0);
      const std::string_view obj = args.substr(0, end);  // to the text's end when it never closes
      auto a = ArgumentsText(obj);
      out.calls.push_back({name, a ? *a : std::string(obj), ""});
      if (end == std::string_view::npos) break;
      const size_t next = args.find(kMistralCalls, end);
      if (next == std::string_view::npos) break;
      calls = Trim(args.substr(next + kMistralCalls.size()));
    }
    if (!out.calls.empty()) return out;
  }
  const size_t open = rest.find('[');
  if (open != std::string_view::npos) {
    const size_t end = JsonValueEnd(rest, open);
    if (end != std::string_view::npos) {
      if (auto calls = JsonCalls(rest.substr(open, end - open))) {
        out.calls = std::move(*calls);
        return out;
      }
    }
  }
  out.content += std::string(rest);  // not calls after all: the text without the marker
  return out;
}

// Formats whose calls sit between markers: a block of calls, each call's name and arguments
// between a begin and an end, split by a separator.
struct SectionMarkers {
  std::string_view calls_begin, call_begin, sep, call_end, calls_end;
  bool kimi_ids;  // the name is an id: functions.NAME:INDEX
};
constexpr SectionMarkers kDeepSeekMarkers{kDsCallsBegin, kDsCallBegin, kDsSep, kDsCallEnd, kDsCallsEnd, false};
constexpr SectionMarkers kKimiMarkers{kKimiCallsBegin, kKimiCallBegin, kKimiArgs, kKimiCallEnd, kKimiCallsEnd, true};

// Kimi-K2's call id, functions.NAME:INDEX, as the function's name (the id's "functions." prefix
// and ":INDEX" suffix are optional, as vLLM's parser reads them).
std::string KimiName(std::string_view id) {
  id = Trim(id);
  if (StartsWith(id, "functions.")) id.remove_prefix(10);
  const size_t colon = id.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < id.size() &&
      std::all_of(id.begin() + colon + 1, id.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    id = id.substr(0, colon);
  }
  return std::string(id);
}

// DeepSeek-V3 (and V3.1+) and Kimi-K2: the text before the block is content, the calls in it
// each a name and JSON arguments; text after the closed block goes.
ParsedMessage ParseSections(std::string_view text, const SectionMarkers& m) {
  ParsedMessage out;
  size_t first = text.find(m.calls_begin);
  if (first == std::string_view::npos) first = text.find(m.call_begin);
  if (first == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  out.content = std::string(text.substr(0, first));
  std::vector<ToolCall> calls;
  size_t pos = first;
  bool ok = true;
  while (true) {
    const size_t b = text.find(m.call_begin, pos);
    if (b == std::string_view::npos) break;
    const size_t e = text.find(m.call_end, b);
    const size_t inner_begin = b + m.call_begin.size();
    const std::string_view inner = text.substr(inner_begin, (e == std::string_view::npos ? text.size() : e) - inner_begin);
    const size_t sep = inner.find(m.sep);
    if (sep == std::string_view::npos) {
      ok = false;
      break;
    }
    std::string name = m.kimi_ids ? KimiName(inner.substr(0, sep)) : std::string(Trim(inner.substr(0, sep)));
    std::string_view args = inner.substr(sep + m.sep.size());
    if (!m.kimi_ids && name == "function") {
      // V3: function<sep>NAME\n```json\n{...}\n```
      const size_t nl = args.find('\n');
      name = std::string(Trim(args.substr(0, nl)));
      args = nl == std::string_view::npos ? std::string_view() : args.substr(nl + 1);
      args = Trim(args);
      if (StartsWith(args, "```json")) args.remove_prefix(7);
      if (args.size() >= 3 && args.substr(args.size() - 3) == "```") args.remove_suffix(3);
    }
    auto a = ArgumentsText(args);
    if (name.empty() || !a) {
      ok = false;
      break;
    }
    calls.push_back({name, *a, ""});
    if (e == std::string_view::npos) {
      pos = text.size();
      break;
    }
    pos = e + m.call_end.size();
  }
  std::string_view tail = text.substr(std::min(pos, text.size()));
  // Text after the closed block of calls goes (vLLM's parser drops it too).
  if (StartsWith(Trim(tail), m.calls_end)) tail = {};
  if (!ok || calls.empty()) {
    out.content += std::string(text.substr(first));
    return out;
  }
  out.calls = std::move(calls);
  out.content += std::string(tail);
  return out;
}

// gpt-oss's harmony: messages of a header (<|channel|>NAME, maybe to=functions.X and
// <|constrain|>json) and a body after <|message|>, each ended by <|end|>, <|call|> or <|return|>
// (or the text's end: the stop token that ended generation is not in the text).
constexpr std::string_view kHarmonyMessage = "<|message|>";
constexpr std::string_view kHarmonyEnds[] = {"<|end|>", "<|call|>", "<|return|>", "<|start|>"};

// One harmony message from text[pos]: its header, its body up to its end marker (or the text's
// end: `whole` false), and where the next message's header starts.
struct HarmonyMessage {
  enum class Kind { kContent, kReasoning, kCall, kEcho } kind = Kind::kContent;
  std::string name;  // kCall
  size_t body_begin = 0, body_end = 0, next = 0;
  bool whole = false;
};

std::optional<HarmonyMessage> NextHarmonyMessage(std::string_view text, size_t pos) {
  const size_t msg = text.find(kHarmonyMessage, pos);
  if (msg == std::string_view::npos) return std::nullopt;  // a header without a body: nothing to say
  const std::string_view header = text.substr(pos, msg - pos);
  HarmonyMessage m;
  m.body_begin = msg + kHarmonyMessage.size();
  m.body_end = m.next = text.size();
  for (std::string_view term : kHarmonyEnds) {
    const size_t at = text.find(term, m.body_begin);
    if (at < m.body_end) {
      m.body_end = at;
      m.next = at + (term == "<|start|>" ? 0 : term.size());
      m.whole = true;
    }
  }
  auto word_after = [&](std::string_view key) -> std::string {
    const size_t at = header.find(key);
    if (at == std::string_view::npos) return "";
    size_t b = at + key.size(), e = b;
    while (e < header.size() && header[e] != ' ' && header[e] != '<' && header[e] != '\n') ++e;
    return std::string(header.substr(b, e - b));
  };
  const std::string channel = word_after("<|channel|>");
  const std::string recipient = word_after("to=");
  if (recipient == "assistant") {
    m.kind = HarmonyMessage::Kind::kEcho;  // a tool's answer echoed back: neither a call nor text
  } else if (!recipient.empty() && recipient != "functions.") {
    // A call: to=functions.NAME, or a bare or dotted name (math.sum).
    m.kind = HarmonyMessage::Kind::kCall;
    m.name = StartsWith(recipient, "functions.") ? recipient.substr(10) : recipient;
  } else if (channel == "analysis") {
    m.kind = HarmonyMessage::Kind::kReasoning;
  }  // else final, or a commentary preamble: content
  return m;
}

// Where the message after one ending at `next` starts (past <|start|>assistant).
size_t HarmonyNext(std::string_view text, size_t next) {
  if (StartsWith(text.substr(next), "<|start|>")) next += 9;
  if (StartsWith(text.substr(next), "assistant")) next += 9;
  return next;
}

ParsedMessage ParseHarmony(std::string_view text) {
  ParsedMessage out;
  if (text.find(kHarmonyMessage) == std::string_view::npos) {
    out.content = std::string(text);
    return out;
  }
  size_t pos = 0;
  while (pos < text.size()) {
    const auto m = NextHarmonyMessage(text, pos);
    if (!m) break;
    const std::string_view body = text.substr(m->body_begin, m->body_end - m->body_begin);
    switch (m->kind) {
      case HarmonyMessage::Kind::kEcho: break;
      case HarmonyMessage::Kind::kCall: {
        // Arguments that are not a JSON object come back as written, as vLLM returns them.
        auto a = ArgumentsText(body);
        out.calls.push_back({m->name, a ? *a : std::string(Trim(body)), ""});
        break;
      }
      case HarmonyMessage::Kind::kReasoning: out.reasoning += std::string(body); break;
      case HarmonyMessage::Kind::kContent: out.content += std::string(body); break;
    }
    pos = HarmonyNext(text, m->next);
  }
  return out;
}

// Functionary v3.1: <function=NAME>{...}</function>, any number, text around them content.
ParsedMessage ParseFunctionary(std::string_view text) {
  constexpr std::string_view kOpen = "<function=", kClose = "</function>";
  ParsedMessage out;
  size_t pos = 0;
  while (true) {
    const size_t start = text.find(kOpen, pos);
    if (start == std::string_view::npos) break;
    out.content += std::string(text.substr(pos, start - pos));
    const size_t name_end = text.find('>', start);
    const size_t obj = name_end == std::string_view::npos ? name_end : name_end + 1;
    const size_t end = obj < text.size() && text[obj] == '{' ? JsonValueEnd(text, obj) : std::string_view::npos;
    if (end == std::string_view::npos) {  // not a call after all: the rest is text
      pos = start;
      break;
    }
    const std::string name(Trim(text.substr(start + kOpen.size(), name_end - start - kOpen.size())));
    auto a = ArgumentsText(text.substr(obj, end - obj));
    size_t next = end;
    if (StartsWith(text.substr(next), kClose)) next += kClose.size();
    if (name.empty() || !a) {
      out.content += std::string(text.substr(start, next - start));
    } else {
      out.calls.push_back({name, *a, ""});
    }
    pos = next;
  }
  out.content += std::string(text.substr(std::min(pos, text.size())));
  return out;
}

// Functionary v3.2: the prompt ends with ">>>", so the message starts with a recipient line;
// every later part starts with ">>>" and its own. "all\n" + text is content; "NAME\n" + a JSON
// object a call; "python\n" + code (not JSON) a call of python with {"code": ...}. A part that is
// none of these stays in the content as it was written.
// A functionary_v3_2 recipient that names a function.
bool IsFunctionaryName(std::string_view n) {
  if (n.empty()) return false;
  for (char c : n) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.') return false;
  }
  return true;
}

ParsedMessage ParseFunctionaryV32(std::string_view text) {
  constexpr std::string_view kSep = ">>>";
  ParsedMessage out;
  if (StartsWith(text, kSep)) text.remove_prefix(kSep.size());
  bool first = true;
  while (true) {
    const size_t end = text.find(kSep);
    const std::string_view part = text.substr(0, end);
    const size_t nl = part.find('\n');
    const std::string_view recipient = part.substr(0, nl);
    const std::string_view body = nl == std::string_view::npos ? std::string_view() : part.substr(nl + 1);
    auto raw = [&] { out.content += (first ? "" : std::string(kSep)) + std::string(part); };
    if (recipient == "all") {
      out.content += std::string(body);
    } else if (nl != std::string_view::npos && IsFunctionaryName(recipient)) {
      auto a = ArgumentsText(body);
      if (a) {
        out.calls.push_back({std::string(recipient), *a, ""});
      } else if (recipient == "python" && !Trim(body).empty()) {
        out.calls.push_back({"python", JsonText(Json{{"code", std::string(body)}}), ""});
      } else {
        raw();
      }
    } else {
      raw();
    }
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + kSep.size());
    first = false;
  }
  return out;
}

// Where the next call of a streamed message starts (ScanCalls): its name, and where its
// arguments begin (a JSON object's '{', or just past Qwen3-Coder's <function=NAME>).
enum class Found { kYes, kNeedMore, kNo };
struct CallHeader {
  Found found = Found::kNeedMore;
  std::string name;
  size_t next = 0;
  bool xml = false, glm = false, gemma = false, wrapped = false, array = false;
};

// Matches lit at s[*i] (advancing *i), or says the text ends inside it, or that it is not there.
Found Expect(std::string_view s, size_t* i, std::string_view lit) {
  const std::string_view rest = s.substr(std::min(*i, s.size()));
  if (StartsWith(rest, lit)) {
    *i += lit.size();
    return Found::kYes;
  }
  return rest.size() < lit.size() && lit.substr(0, rest.size()) == rest ? Found::kNeedMore : Found::kNo;
}

CallHeader NotYet(Found f) {
  CallHeader h;
  h.found = f;
  return h;
}

// One GLM argument value (trimmed text) as JSON, as vLLM's glm45 parser reads it: a declared
// string's value is its text; any other value is JSON, else a Python literal, else its text.
Json GlmValue(std::string_view value, std::string_view type) {
  if (type == "string") return Json(std::string(value));
  if (auto j = ParseJson(value)) return *j;
  if (auto j = PythonLiteral(value)) return *j;
  return Json(std::string(value));
}

std::string DeclaredType(const ToolParamTypes* types, const std::string& fn, const std::string& key) {
  if (types == nullptr) return "";
  const auto f = types->find(fn);
  if (f == types->end()) return "";
  const auto t = f->second.find(key);
  return t == f->second.end() ? "" : t->second;
}

// One GLM key/value pair at s[i] (after white space): <arg_key>K</arg_key> <arg_value>V</arg_value>.
// found: kYes with *key, *value (trimmed) and *end set; kNeedMore when s ends inside it; kNo when
// something else is there.
Found GlmPair(std::string_view s, size_t i, std::string_view* key, std::string_view* value, size_t* end) {
  i = SkipSpace(s, i);
  if (Found f = Expect(s, &i, kGlmKey); f != Found::kYes) return f;
  const size_t key_end = s.find(kGlmKeyEnd, i);
  if (key_end == std::string_view::npos) return Found::kNeedMore;
  size_t v = SkipSpace(s, key_end + kGlmKeyEnd.size());
  if (Found f = Expect(s, &v, kGlmValue); f != Found::kYes) return f;
  const size_t value_end = s.find(kGlmValueEnd, v);
  if (value_end == std::string_view::npos) return Found::kNeedMore;
  *key = Trim(s.substr(i, key_end - i));
  *value = Trim(s.substr(v, value_end - v));
  *end = value_end + kGlmValueEnd.size();
  return Found::kYes;
}

// Key/value pairs from inner[pos] to its end, read by `pair` (GlmPair, NamedParam) with white
// space between, each value converted by its declared type (GlmValue); nullopt when anything else
// is there.
using PairReader = Found (*)(std::string_view, size_t, std::string_view*, std::string_view*, size_t*);
std::optional<Json> PairArguments(std::string_view inner, size_t pos, PairReader pair, const std::string& fn,
                                  const ToolParamTypes* types) {
  Json args = Json::object();
  while (SkipSpace(inner, pos) < inner.size()) {
    std::string_view key, value;
    if (pair(inner, pos, &key, &value, &pos) != Found::kYes) return std::nullopt;
    args[std::string(key)] = GlmValue(value, DeclaredType(types, fn, std::string(key)));
  }
  return args;
}

// GLM-4.5's call, the text between <tool_call> and </tool_call>: the name (up to a line break or
// the first <arg_key>), then key/value pairs with white space between, each value converted by
// its declared type (GlmValue). Anything else inside makes it no call.
std::optional<ToolCall> CallFromGlm(std::string_view inner, const ToolParamTypes* types) {
  const size_t name_end = std::min({inner.find('\n'), inner.find(kGlmKey), inner.size()});
  ToolCall call{std::string(Trim(inner.substr(0, name_end))), "", ""};
  if (call.name.empty() || call.name.find_first_of("<>") != std::string::npos) return std::nullopt;
  auto args = PairArguments(inner, name_end, GlmPair, call.name, types);
  if (!args) return std::nullopt;
  call.arguments = JsonText(*args);
  return call;
}

// GLM-4.5 to 4.7: calls are <tool_call>...</tool_call> (CallFromGlm); the text around them is
// content, and so is a call that does not parse or is cut off before </tool_call>.
ParsedMessage ParseGlm(std::string_view text, const ToolParamTypes* types) {
  ParsedMessage out;
  size_t pos = 0;
  while (true) {
    const size_t start = text.find(kHermesOpen, pos);
    const size_t close = start == std::string_view::npos ? start : text.find(kHermesClose, start);
    if (close == std::string_view::npos) break;
    out.content += text.substr(pos, start - pos);
    const size_t inner = start + kHermesOpen.size(), next = close + kHermesClose.size();
    if (auto call = CallFromGlm(text.substr(inner, close - inner), types)) {
      out.calls.push_back(std::move(*call));
    } else {
      out.content += text.substr(start, next - start);
    }
    pos = next;
  }
  out.content += text.substr(pos);
  return out;
}

// A name as MiniMax writes it in a tag's attribute: trimmed, its quotes (double or single) removed.
std::string_view Unquoted(std::string_view s) {
  s = Trim(s);
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front()) s = s.substr(1, s.size() - 2);
  return s;
}

// One MiniMax parameter at s[i] (after white space): <parameter name="K">V</parameter>.
Found NamedParam(std::string_view s, size_t i, std::string_view* key, std::string_view* value, size_t* end) {
  i = SkipSpace(s, i);
  if (Found f = Expect(s, &i, kNamedParam); f != Found::kYes) return f;
  const size_t key_end = s.find('>', i);
  if (key_end == std::string_view::npos) return Found::kNeedMore;
  const size_t value_end = s.find(kParamEnd, key_end);
  if (value_end == std::string_view::npos) return Found::kNeedMore;
  *key = Unquoted(s.substr(i, key_end - i));
  *value = Trim(s.substr(key_end + 1, value_end - key_end - 1));
  *end = value_end + kParamEnd.size();
  return key->empty() ? Found::kNo : Found::kYes;
}

// MiniMax-M2's call, the text between <invoke name= and </invoke>: the quoted name, then
// parameters with white space between, each value converted by its declared type as glm45's are
// (GlmValue). Anything else inside makes it no call.
std::optional<ToolCall> CallFromInvoke(std::string_view inner, const ToolParamTypes* types) {
  const size_t name_end = inner.find('>');
  if (name_end == std::string_view::npos) return std::nullopt;
  ToolCall call{std::string(Unquoted(inner.substr(0, name_end))), "", ""};
  if (call.name.empty() || call.name.find_first_of("<>\n\"") != std::string::npos) return std::nullopt;
  auto args = PairArguments(inner, name_end + 1, NamedParam, call.name, types);
  if (!args) return std::nullopt;
  call.arguments = JsonText(*args);
  return call;
}

// MiniMax-M2: calls are <invoke>s inside <minimax:tool_call>...</minimax:tool_call> blocks; the
// text around the blocks is content, and so is a block that does not parse whole or is cut off.
ParsedMessage ParseMinimax(std::string_view text, const ToolParamTypes* types) {
  ParsedMessage out;
  size_t pos = 0;
  while (true) {
    const size_t start = text.find(kMinimaxOpen, pos);
    const size_t close = start == std::string_view::npos ? start : text.find(kMinimaxClose, start);
    if (close == std::string_view::npos) break;
    out.content += text.substr(pos, start - pos);
    const std::string_view inner = text.substr(start + kMinimaxOpen.size(), close - start - kMinimaxOpen.size());
    const size_t next = close + kMinimaxClose.size();
    std::vector<ToolCall> calls;
    size_t i = 0;
    bool whole = true;
    while (whole && SkipSpace(inner, i) < inner.size()) {
      i = SkipSpace(inner, i);
      const size_t end = inner.find(kInvokeEnd, i);
      std::optional<ToolCall> call;
      if (Expect(inner, &i, kInvoke) == Found::kYes && end != std::string_view::npos) {
        call = CallFromInvoke(inner.substr(i, end - i), types);
      }
      if (!call) whole = false;
      if (call) calls.push_back(std::move(*call));
      i = end == std::string_view::npos ? inner.size() : end + kInvokeEnd.size();
    }
    if (whole && !calls.empty()) {
      for (ToolCall& c : calls) out.calls.push_back(std::move(c));
    } else {
      out.content += text.substr(start, next - start);
    }
    pos = next;
  }
  out.content += text.substr(pos);
  return out;
}

// A function name Gemma 4's call syntax can hold: not empty, none of < > { } space or line break.
bool IsGemmaName(std::string_view name) { return !name.empty() && name.find_first_of("<>{} \n") == std::string_view::npos; }

// Gemma 4's call at text[i] (just past <|tool_call>call:): the name up to '{', then the arguments
// read by GemmaArgsReader, then <tool_call|> (or the text's end, or the next call: the end
// marker may be cut off). *end: one past it.
std::optional<ToolCall> CallFromGemma(std::string_view text, size_t i, size_t* end) {
  const size_t brace = text.find('{', i);
  if (brace == std::string_view::npos) return std::nullopt;
  ToolCall call;
  call.name = std::string(Trim(text.substr(i, brace - i)));
  if (!IsGemmaName(call.name)) return std::nullopt;
  GemmaArgsReader reader;
  size_t k = brace;
  while (k < text.size() && reader.state() == GemmaArgsReader::State::kMore) reader.Feed(text[k++], &call.arguments);
  if (reader.state() != GemmaArgsReader::State::kDone) return std::nullopt;
  const Found close = Expect(text, &k, kGemmaCallEnd);
  if (close == Found::kNeedMore) k = text.size();
  if (close == Found::kNo && k < text.size() && !StartsWith(text.substr(k), kGemmaCall)) return std::nullopt;
  *end = k;
  return call;
}

// Gemma 4: calls are <|tool_call>call:NAME{...}<tool_call|>; the text around them is content, and
// so is a call that does not read whole. The message ends at <|tool_response> (where the model
// expects the tools' answers).
ParsedMessage ParseGemma4(std::string_view text) {
  ParsedMessage out;
  text = text.substr(0, text.find(kGemmaResponse));
  size_t pos = 0;
  while (true) {
    const size_t start = text.find(kGemmaCall, pos);
    if (start == std::string_view::npos) break;
    size_t end = 0;
    std::optional<ToolCall> call = CallFromGemma(text, start + kGemmaCall.size(), &end);
    if (!call) {
      out.content += text.substr(pos, start + kGemmaCall.size() - pos);
      pos = start + kGemmaCall.size();
      continue;
    }
    out.content += text.substr(pos, start - pos);
    out.calls.push_back(std::move(*call));
    pos = end;
  }
  out.content += text.substr(pos);
  return out;
}

// {"name": "X", "arguments" | "parameters": {   at s[i] (name first: otherwise the call goes whole
// at the end).
CallHeader WrapperHeader(std::string_view s, size_t i) {
  for (std::string_view lit : {std::string_view("{"), std::string_view("\"name\""), std::string_view(":")}) {
    i = SkipSpace(s, i);
    if (Found f = Expect(s, &i, lit); f != Found::kYes) return NotYet(f);
  }
  i = SkipSpace(s, i);
  if (i >= s.size()) return NotYet(Found::kNeedMore);
  if (s[i] != '"') return NotYet(Found::kNo);
  const size_t name_end = ValueEnd(s, i);
  if (name_end == std::string_view::npos) return NotYet(Found::kNeedMore);
  auto name = ParseJson(s.substr(i, name_end - i));
  if (!name || !name->is_string() || name->get<std::string>().empty()) return NotYet(Found::kNo);
  i = SkipSpace(s, name_end);
  if (Found f = Expect(s, &i, ","); f != Found::kYes) return NotYet(f);
  i = SkipSpace(s, i);
  if (i >= s.size()) return NotYet(Found::kNeedMore);
  const size_t key_end = s[i] == '"' ? ValueEnd(s, i) : std::string_view::npos;
  if (s[i] != '"') return NotYet(Found::kNo);
  if (key_end == std::string_view::npos) return NotYet(Found::kNeedMore);
  const std::string_view key = s.substr(i + 1, key_end - i - 2);
  if (key != "arguments" && key != "parameters") return NotYet(Found::kNo);
  i = SkipSpace(s, key_end);
  if (Found f = Expect(s, &i, ":"); f != Found::kYes) return NotYet(f);
  i = SkipSpace(s, i);
  if (i >= s.size()) return NotYet(Found::kNeedMore);
  if (s[i] != '{') return NotYet(Found::kNo);  // arguments encoded as a string: whole at the end
  CallHeader h;
  h.found = Found::kYes;
  h.name = name->get<std::string>();
  h.next = i;
  h.wrapped = true;
  return h;
}

// A name up to `end` (a '>' or a separator) from s[i]: found, or more text needed (a name is short).
CallHeader NameUntil(std::string_view s, size_t i, std::string_view end) {
  const size_t e = s.find(end, i);
  if (e == std::string_view::npos) return NotYet(s.size() - i > 256 ? Found::kNo : Found::kNeedMore);
  CallHeader h;
  h.name = std::string(Trim(s.substr(i, e - i)));
  h.found = h.name.empty() || h.name.find_first_of("<\n") != std::string::npos ? Found::kNo : Found::kYes;
  h.next = e + end.size();
  return h;
}

// Arguments as a JSON object at s[i] (after spaces): found there, more text needed, or not.
CallHeader ObjectAt(CallHeader h, std::string_view s) {
  if (h.found != Found::kYes) return h;
  const size_t i = SkipSpace(s, h.next);
  if (i >= s.size()) return NotYet(Found::kNeedMore);
  if (s[i] != '{') return NotYet(Found::kNo);
  h.next = i;
  return h;
}

bool IsNameChar(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.'; }

// mistral's next call from s[pos]: [TOOL_CALLS]name[ARGS]{...}, or an array of {"name": ...,
// "arguments": ...} after [TOOL_CALLS] (or leading the message: the marker is a control token);
// inside the array (array), the next one after a comma.
CallHeader MistralHeader(std::string_view s, size_t pos, bool first, bool array) {
    size_t i = SkipSpace(s, pos);
    if (array) {
      if (i >= s.size()) return NotYet(Found::kNeedMore);
      if (s[i] != ',') return NotYet(Found::kNo);  // ']': the array ends
      CallHeader h = WrapperHeader(s, i + 1);
      h.array = true;
      return h;
    }
    const size_t at = s.find(kMistralCalls, pos);
    if (size_t m = i; at == std::string_view::npos && Expect(s, &m, kMistralCalls) == Found::kNeedMore) {
      return NotYet(Found::kNeedMore);  // the marker may be coming
    }
    if (at != std::string_view::npos) {
      i = SkipSpace(s, at + kMistralCalls.size());
    } else if (!first || i >= s.size() || s[i] != '[') {
      return NotYet(Found::kNeedMore);
    }
    if (i >= s.size()) return NotYet(Found::kNeedMore);
    if (s[i] == '[') {
      CallHeader h = WrapperHeader(s, i + 1);
      h.array = true;
      return h;
    }
    size_t e = i;
    while (e < s.size() && IsNameChar(s[e])) ++e;
    if (e >= s.size()) return NotYet(Found::kNeedMore);
    if (e == i) return NotYet(Found::kNo);
    CallHeader h;
    h.found = Found::kYes;
    h.name = std::string(s.substr(i, e - i));
    h.next = SkipSpace(s, e);
    if (Found a = Expect(s, &h.next, kMistralArgs); a == Found::kNeedMore) return NotYet(a);
    return ObjectAt(h, s);
}

// The next call's header in s from pos on, in format f (first: no call seen yet; array: inside
// mistral's array of calls, after one).
CallHeader FindCallHeader(ToolCallFormat f, std::string_view s, size_t pos, bool first, bool array) {
  switch (f) {
    case ToolCallFormat::kHermes: {
      const size_t at = s.find(kHermesOpen, pos);
      if (at == std::string_view::npos) return NotYet(Found::kNeedMore);
      return WrapperHeader(s, at + kHermesOpen.size());
    }
    case ToolCallFormat::kQwen3Coder: {
      const size_t tag = s.find(kHermesOpen, pos), bare = s.find(kXmlFunction, pos);
      if (tag == std::string_view::npos && bare == std::string_view::npos) return NotYet(Found::kNeedMore);
      size_t i = bare;
      if (tag < bare) {
        i = SkipSpace(s, tag + kHermesOpen.size());
        if (i < s.size() && s[i] == '{') return WrapperHeader(s, i);
        if (Found e = Expect(s, &i, kXmlFunction); e != Found::kYes) return NotYet(e);
        i -= kXmlFunction.size();
      }
      CallHeader h = NameUntil(s, i + kXmlFunction.size(), ">");
      h.xml = true;
      return h;
    }
    case ToolCallFormat::kGlm45: {
      const size_t at = s.find(kHermesOpen, pos);
      if (at == std::string_view::npos) return NotYet(Found::kNeedMore);
      // The name ends at a line break, the first <arg_key> or </tool_call> (no arguments).
      const size_t i = at + kHermesOpen.size();
      const size_t e = std::min({s.find('\n', i), s.find(kGlmKey, i), s.find(kHermesClose, i)});
      if (e == std::string_view::npos) return NotYet(s.size() - i > 256 ? Found::kNo : Found::kNeedMore);
      CallHeader h;
      h.name = std::string(Trim(s.substr(i, e - i)));
      h.found = h.name.empty() || h.name.find_first_of("<>") != std::string::npos ? Found::kNo : Found::kYes;
      h.next = e;
      h.glm = true;
      return h;
    }
    case ToolCallFormat::kMinimaxM2: {
      const size_t at = s.find(kInvoke, pos);
      if (at == std::string_view::npos) return NotYet(Found::kNeedMore);
      CallHeader h = NameUntil(s, at + kInvoke.size(), ">");
      if (h.found != Found::kYes) return h;
      h.name = std::string(Unquoted(h.name));
      if (h.name.empty() || h.name.find('"') != std::string::npos) return NotYet(Found::kNo);
      h.glm = true;  // parameter pairs, as glm45's
      return h;
    }
    case ToolCallFormat::kLlama3Json: {
      size_t i = SkipSpace(s, pos);
      while (i < s.size() && s[i] == ';') i = SkipSpace(s, i + 1);
      if (Expect(s, &i, kPythonTag) == Found::kNeedMore) return NotYet(Found::kNeedMore);
      i = SkipSpace(s, i);
      if (i >= s.size()) return NotYet(Found::kNeedMore);
      return WrapperHeader(s, i);
    }
    case ToolCallFormat::kMistral: return MistralHeader(s, pos, first, array);
    case ToolCallFormat::kDeepSeekV3: {
      const size_t at = s.find(kDsCallBegin, pos);
      if (at == std::string_view::npos) return NotYet(Found::kNeedMore);
      CallHeader h = NameUntil(s, at + kDsCallBegin.size(), kDsSep);
      if (h.found == Found::kYes && h.name == "function") {  // V3: function<sep>NAME\n```json\n{...}
        h = NameUntil(s, h.next, "\n");
        if (h.found != Found::kYes) return h;
        h.next = SkipSpace(s, h.next);
        if (Found e = Expect(s, &h.next, "```json"); e == Found::kNeedMore) return NotYet(e);
      }
      return ObjectAt(h, s);
    }
    case ToolCallFormat::kKimiK2: {
      const size_t at = s.find(kKimiCallBegin, pos);
      if (at == std::string_view::npos) return NotYet(Found::kNeedMore);
      CallHeader h = NameUntil(s, at + kKimiCallBegin.size(), kKimiArgs);
      if (h.found == Found::kYes) {
        h.name = KimiName(h.name);
        if (h.name.empty()) return NotYet(Found::kNo);
      }
      return ObjectAt(h, s);
    }
    case ToolCallFormat::kFunctionary: {
      const size_t at = s.find(kXmlFunction, pos);
      if (at == std::string_view::npos) return NotYet(Found::kNeedMore);
      return ObjectAt(NameUntil(s, at + kXmlFunction.size(), ">"), s);
    }
    case ToolCallFormat::kGemma4: {
      const size_t at = s.find(kGemmaCall, pos);
      if (at == std::string_view::npos) return NotYet(Found::kNeedMore);
      CallHeader h = NameUntil(s, at + kGemmaCall.size(), "{");
      if (h.found != Found::kYes) return h;
      if (!IsGemmaName(h.name)) return NotYet(Found::kNo);
      h.next -= 1;  // the arguments start at their '{'
      h.gemma = true;
      return h;
    }
    case ToolCallFormat::kGptOss:
    case ToolCallFormat::kFunctionaryV32: break;
  }
  return NotYet(Found::kNo);
}

// The texts that may start a call in each format (held back while they might be one).
// Static tables: a streamed message asks on every delta.
std::span<const std::string_view> Markers(ToolCallFormat f) {
  static constexpr std::string_view kTagged[] = {kHermesOpen}, kQwenXml[] = {kHermesOpen, kXmlFunction},
                                    kLlama[] = {kPythonTag}, kMistral[] = {kMistralCalls},
                                    kDeepSeek[] = {kDsCallsBegin, kDsCallBegin}, kFunctionary[] = {"<function="},
                                    kMinimax[] = {kMinimaxOpen}, kKimi[] = {kKimiCallsBegin, kKimiCallBegin},
                                    kGemma[] = {kGemmaCall, kGemmaResponse};
  switch (f) {
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kGlm45: return kTagged;
    case ToolCallFormat::kQwen3Coder: return kQwenXml;
    case ToolCallFormat::kMinimaxM2: return kMinimax;
    case ToolCallFormat::kLlama3Json: return kLlama;
    case ToolCallFormat::kMistral: return kMistral;
    case ToolCallFormat::kDeepSeekV3: return kDeepSeek;
    case ToolCallFormat::kKimiK2: return kKimi;
    case ToolCallFormat::kGemma4: return kGemma;
    case ToolCallFormat::kFunctionary: return kFunctionary;
    case ToolCallFormat::kGptOss:
    case ToolCallFormat::kFunctionaryV32: break;  // read a part (message) at a time
  }
  return {};
}

// Length of the longest suffix of s that is a proper prefix of marker.
size_t PartialMarker(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

const char* ToolCallFormatName(ToolCallFormat f) {
  switch (f) {
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kDeepSeekV3: return "deepseek_v3";
    case ToolCallFormat::kKimiK2: return "kimi_k2";
    case ToolCallFormat::kQwen3Coder: return "qwen3_coder";
    case ToolCallFormat::kGlm45: return "glm45";
    case ToolCallFormat::kMinimaxM2: return "minimax_m2";
    case ToolCallFormat::kGptOss: return "gpt_oss";
    case ToolCallFormat::kGemma4: return "gemma4";
    case ToolCallFormat::kFunctionary: return "functionary";
    case ToolCallFormat::kFunctionaryV32: return "functionary_v3_2";
  }
  return "";
}

StatusOr<ToolCallFormat> ParseToolCallFormat(const std::string& name) {
  for (auto f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral, ToolCallFormat::kDeepSeekV3,
                 ToolCallFormat::kKimiK2, ToolCallFormat::kQwen3Coder, ToolCallFormat::kGlm45, ToolCallFormat::kMinimaxM2, ToolCallFormat::kGptOss,
                 ToolCallFormat::kGemma4, ToolCallFormat::kFunctionary, ToolCallFormat::kFunctionaryV32}) {
    if (name == ToolCallFormatName(f)) return f;
  }
  return InvalidArgument("tool call parser '{}' is not one of hermes, llama3_json, mistral, deepseek_v3, kimi_k2, qwen3_coder, "
                         "glm45, minimax_m2, gpt_oss, gemma4, functionary, functionary_v3_2", name);
}

ToolCallFormat DetectToolCallFormat(std::string_view src) {
  if (src.find("<|channel|>") != std::string_view::npos) return ToolCallFormat::kGptOss;
  if (src.find(kKimiCallsBegin) != std::string_view::npos) return ToolCallFormat::kKimiK2;
  if (src.find(kGemmaCall) != std::string_view::npos) return ToolCallFormat::kGemma4;
  if (src.find(">>>all") != std::string_view::npos) return ToolCallFormat::kFunctionaryV32;
  if (src.find(kGlmKey) != std::string_view::npos) return ToolCallFormat::kGlm45;
  if (src.find(kMinimaxOpen) != std::string_view::npos) return ToolCallFormat::kMinimaxM2;
  if (src.find("<function=") != std::string_view::npos && src.find("<tool_call>") != std::string_view::npos) {
    return ToolCallFormat::kQwen3Coder;
  }
  if (src.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::kHermes;
  if (src.find("<function=") != std::string_view::npos) return ToolCallFormat::kFunctionary;
  if (src.find("tool▁call▁begin") != std::string_view::npos) return ToolCallFormat::kDeepSeekV3;
  if (src.find("[TOOL_CALLS]") != std::string_view::npos) return ToolCallFormat::kMistral;
  if (src.find("<|python_tag|>") != std::string_view::npos || src.find("\"parameters\": dictionary") != std::string_view::npos) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kHermes;
}

ToolParamTypes ParamTypesOf(const nlohmann::ordered_json& tools) {
  ToolParamTypes out;
  if (!tools.is_array()) return out;
  for (const Json& t : tools) {
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const Json& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) continue;
    auto& params = out[fn["name"].get<std::string>()];
    const Json* props = fn.contains("parameters") && fn["parameters"].is_object() && fn["parameters"].contains("properties")
                            ? &fn["parameters"]["properties"]
                            : nullptr;
    if (props == nullptr || !props->is_object()) continue;
    for (auto it = props->begin(); it != props->end(); ++it) {
      const Json& p = it.value();
      std::string type;
      if (p.is_object() && p.contains("type")) {
        const Json& ty = p["type"];
        if (ty.is_string()) {
          type = ty.get<std::string>();
        } else if (ty.is_array()) {  // ["string", "null"]: a string (null is written as null)
          for (const Json& e : ty) {
            if (e.is_string() && e != "null") type = type.empty() ? e.get<std::string>() : "mixed";
          }
        }
      } else if (p.is_object() && p.contains("enum") && p["enum"].is_array() && !p["enum"].empty() &&
                 std::all_of(p["enum"].begin(), p["enum"].end(), [](const Json& e) { return e.is_string(); })) {
        type = "string";
      }
      if (type == "mixed") type.clear();
      params[it.key()] = type;
    }
  }
  return out;
}

ParsedMessage ParseToolCalls(ToolCallFormat f, std::string_view text, const ToolParamTypes* types) {
  ParsedMessage out;
  switch (f) {
    case ToolCallFormat::kHermes: out = ParseTagged(text, /*xml=*/false, types); break;
    case ToolCallFormat::kQwen3Coder: out = ParseTagged(text, /*xml=*/true, types); break;
    case ToolCallFormat::kGlm45: out = ParseGlm(text, types); break;
    case ToolCallFormat::kMinimaxM2: out = ParseMinimax(text, types); break;
    case ToolCallFormat::kLlama3Json: out = ParseLlama3(text); break;
    case ToolCallFormat::kMistral: out = ParseMistral(text); break;
    case ToolCallFormat::kDeepSeekV3: out = ParseSections(text, kDeepSeekMarkers); break;
    case ToolCallFormat::kKimiK2: out = ParseSections(text, kKimiMarkers); break;
    case ToolCallFormat::kGptOss: out = ParseHarmony(text); break;
    case ToolCallFormat::kGemma4: out = ParseGemma4(text); break;
    case ToolCallFormat::kFunctionary: out = ParseFunctionary(text); break;
    case ToolCallFormat::kFunctionaryV32: out = ParseFunctionaryV32(text); break;
  }
  if (!out.calls.empty()) out.content = std::string(Trim(out.content));
  return out;
}

namespace {

// One character of a JSON string's text, escaped as JSON needs.
void AppendJsonChar(char c, std::string* out) {
  switch (c) {
    case '"': *out += "\\\""; break;
    case '\\': *out += "\\\\"; break;
    case '\n': *out += "\\n"; break;
    case '\r': *out += "\\r"; break;
    case '\t': *out += "\\t"; break;
    default:
      if (static_cast<unsigned char>(c) < 0x20) {
        *out += fmt::format("\\u{:04x}", static_cast<int>(c));
      } else {
        *out += c;
      }
  }
}

}  // namespace

GemmaArgsReader::State GemmaArgsReader::Feed(char c, std::string* out) {
  if (state_ != State::kMore) return state_;
  // A <|"|> mark may start wherever a '<' is read; held until it is one or is not.
  if (!held_.empty() || c == '<') {
    held_ += c;
    if (held_ == kGemmaQuote) {
      held_.clear();
      Mark(out);
    } else if (!StartsWith(kGemmaQuote, held_)) {
      const std::string held = std::move(held_);
      held_.clear();
      Char(held[0], out);
      for (size_t i = 1; i < held.size() && state_ == State::kMore; ++i) Feed(held[i], out);
    }
    return state_;
  }
  Char(c, out);
  return state_;
}

void GemmaArgsReader::Mark(std::string* out) {
  switch (mode_) {
    case Mode::kValue:
    case Mode::kValueOrClose:
      *out += '"';
      key_string_ = false;
      mode_ = Mode::kString;
      break;
    case Mode::kKey:
    case Mode::kKeyOrClose:
      word_.clear();
      key_string_ = true;
      mode_ = Mode::kString;
      break;
    case Mode::kString:
      if (key_string_) {
        *out += JsonText(Json(word_));
        mode_ = Mode::kAfterKey;
      } else {
        *out += '"';
        mode_ = Mode::kAfterValue;
      }
      break;
    default: state_ = State::kError;
  }
}

void GemmaArgsReader::EndBare(std::string* out) {
  static const std::pair<std::string_view, std::string_view> kPython[] = {{"None", "null"}, {"True", "true"}, {"False", "false"}};
  const std::string_view word = Trim(word_);
  std::optional<Json> v = ParseJson(word);
  if (v && (v->is_number() || v->is_boolean() || v->is_null())) {
    *out += word;
  } else if (auto it = std::find_if(std::begin(kPython), std::end(kPython), [&](const auto& p) { return p.first == word; });
             it != std::end(kPython)) {
    *out += it->second;
  } else {
    *out += JsonText(Json(std::string(word)));
  }
  word_.clear();
  mode_ = Mode::kAfterValue;
}

void GemmaArgsReader::Close(char c, std::string* out) {
  if (stack_.empty() || (c == '}') != (stack_.back() == 'o')) {
    state_ = State::kError;
    return;
  }
  *out += c;
  stack_.pop_back();
  mode_ = Mode::kAfterValue;
  if (stack_.empty()) state_ = State::kDone;
}

void GemmaArgsReader::Char(char c, std::string* out) {
  const bool space = IsJsonSpace(c);
  switch (mode_) {
    case Mode::kString:
      if (key_string_) {
        word_ += c;
      } else {
        AppendJsonChar(c, out);
      }
      return;
    case Mode::kBare:
      if (space || c == ',' || c == '}' || c == ']') {
        EndBare(out);
        Char(c, out);
      } else {
        word_ += c;
      }
      return;
    case Mode::kBareKey:
      if (c == ':') {
        *out += JsonText(Json(std::string(Trim(word_)))) + ":";
        word_.clear();
        mode_ = Mode::kValue;
      } else if (c == ',' || c == '{' || c == '}' || c == '[' || c == ']') {
        state_ = State::kError;
      } else {
        word_ += c;
      }
      return;
    default: break;
  }
  if (space) return;
  switch (mode_) {
    case Mode::kStart:
    case Mode::kValue:
    case Mode::kValueOrClose:
      if (c == ']' && mode_ == Mode::kValueOrClose) {
        Close(c, out);
      } else if (c == '{' || c == '[') {
        if (mode_ == Mode::kStart && c != '{') {
          state_ = State::kError;
          return;
        }
        if (stack_.size() >= static_cast<size_t>(kMaxArgumentDepth)) {
          state_ = State::kError;
          return;
        }
        *out += c;
        stack_ += c == '{' ? 'o' : 'a';
        mode_ = c == '{' ? Mode::kKeyOrClose : Mode::kValueOrClose;
      } else if (mode_ == Mode::kStart || c == ',' || c == ':' || c == '}' || c == ']') {
        state_ = State::kError;
      } else {
        word_.assign(1, c);
        mode_ = Mode::kBare;
      }
      return;
    case Mode::kKey:
    case Mode::kKeyOrClose:
      if (c == '}' && mode_ == Mode::kKeyOrClose) {
        Close(c, out);
      } else if (c == ',' || c == ':' || c == '{' || c == '}' || c == '[' || c == ']') {
        state_ = State::kError;
      } else {
        word_.assign(1, c);
        mode_ = Mode::kBareKey;
      }
      return;
    case Mode::kAfterKey:
      if (c != ':') {
        state_ = State::kError;
        return;
      }
      *out += ':';
      mode_ = Mode::kValue;
      return;
    case Mode::kAfterValue:
      if (c == ',') {
        *out += ',';
        mode_ = stack_.back() == 'o' ? Mode::kKey : Mode::kValue;
      } else if (c == '}' || c == ']') {
        Close(c, out);
      } else {
        state_ = State::kError;
      }
      return;
    default: state_ = State::kError;
  }
}

std::optional<ReasoningMarkers> DetectReasoning(std::string_view src) {
  if (src.find(kGemma4Thought.open) != std::string_view::npos) return kGemma4Thought;
  if (src.find(kThinkTags.close) != std::string_view::npos) return kThinkTags;
  return std::nullopt;
}

std::pair<std::string, std::string> SplitReasoning(std::string_view text, bool starts_thinking, ReasoningMarkers markers) {
  std::string_view t = text;
  const std::string_view lead = Trim(t);
  if (!starts_thinking) {
    if (!StartsWith(lead, markers.open)) return {"", std::string(text)};
    t = lead.substr(markers.open.size());
  }
  const size_t close = t.find(markers.close);
  if (close == std::string_view::npos) return {std::string(t), ""};  // cut while thinking
  return {std::string(t.substr(0, close)), std::string(t.substr(close + markers.close.size()))};
}

MessageStream::MessageStream(std::optional<ToolCallFormat> tools, std::optional<ReasoningMarkers> reasoning,
                             bool starts_thinking, bool forced_calls,
                             std::shared_ptr<const ToolParamTypes> types)
    : tools_(tools),
      types_(std::move(types)),
      reasoning_(reasoning),
      forced_calls_(forced_calls),
      thinking_(reasoning.has_value() && starts_thinking) {
  if (tools_ == ToolCallFormat::kGptOss || tools_ == ToolCallFormat::kFunctionaryV32) scan_ = Scan::kStopped;
}

// gpt_oss: the harmony messages in call_text_ from part_pos_ on, each sent as it is written
// (as ParseHarmony reads them): an analysis body as reasoning, a final or commentary body as
// content, a call's name once its header is whole and its arguments as they grow (when they are a
// JSON object: otherwise they go whole at the end). What could start an end marker is held back.
void MessageStream::ScanHarmony(Delta* d) {
  const std::string_view s = call_text_;
  while (part_pos_ < s.size()) {
    const auto m = NextHarmonyMessage(s, part_pos_);
    if (!m) return;
    size_t avail = m->body_end;
    if (!m->whole) {
      size_t keep = 0;
      for (std::string_view term : kHarmonyEnds) keep = std::max(keep, PartialMarker(s.substr(m->body_begin), term));
      avail -= keep;
    }
    const std::string_view body = s.substr(m->body_begin, avail - m->body_begin);
    const std::string_view fresh = body.substr(std::min(part_sent_, body.size()));
    switch (m->kind) {
      case HarmonyMessage::Kind::kEcho: break;
      case HarmonyMessage::Kind::kReasoning:
        d->reasoning += fresh;
        parts_reasoning_ += fresh.size();
        break;
      case HarmonyMessage::Kind::kContent:
        d->content += fresh;
        parts_content_ += fresh.size();
        break;
      case HarmonyMessage::Kind::kCall: StreamPartCall(m->name, body, d); break;
    }
    part_sent_ = body.size();
    if (!m->whole) return;
    part_pos_ = HarmonyNext(s, m->next);
    part_sent_ = 0;
    part_call_open_ = false;
  }
}

// functionary_v3_2: the parts in call_text_ from part_pos_ on (as ParseFunctionaryV32 reads them,
// split at every ">>>"), each sent as it is written: an "all" part's body as content, a call's name
// once its recipient line is whole and its arguments as they grow (when they are a JSON object:
// python's raw code goes whole at the end). A part that turns out to be neither (no recipient line,
// arguments that do not parse) stops the stream: from there the end says what the rest is, so
// what was sent stays the start of what the whole reading gives.
void MessageStream::ScanFunctionaryV32(Delta* d) {
  constexpr std::string_view kSep = ">>>";
  const std::string_view s = call_text_;
  if (part_pos_ == 0 && !parts_stopped_) {
    // The prompt ends with ">>>"; a model that writes it again starts with it.
    if (s.size() < kSep.size() && kSep.substr(0, s.size()) == s) return;
    if (StartsWith(s, kSep)) part_pos_ = kSep.size();
  }
  while (!parts_stopped_ && part_pos_ < s.size()) {
    const size_t sep = s.find(kSep, part_pos_);
    const size_t nl = s.find('\n', part_pos_);
    if (nl == std::string_view::npos || (sep != std::string_view::npos && sep < nl)) {
      if (sep != std::string_view::npos) parts_stopped_ = true;  // a part with no recipient line
      return;
    }
    const std::string_view recipient = s.substr(part_pos_, nl - part_pos_);
    const bool whole = sep != std::string_view::npos;
    const size_t avail = whole ? sep : s.size() - PartialMarker(s.substr(nl + 1), kSep);
    const std::string_view body = s.substr(nl + 1, avail - (nl + 1));
    if (recipient == "all") {
      const std::string_view fresh = body.substr(std::min(part_sent_, body.size()));
      d->content += fresh;
      parts_content_ += fresh.size();
      part_sent_ = body.size();
    } else if (IsFunctionaryName(recipient)) {
      StreamPartCall(recipient, body, d);
      if (whole && !ArgumentsText(body) && !(recipient == "python" && !Trim(body).empty())) parts_stopped_ = true;
    } else {
      parts_stopped_ = true;
    }
    if (!whole || parts_stopped_) return;
    part_pos_ = sep + kSep.size();
    part_sent_ = 0;
    part_call_open_ = false;
  }
}

// A call in a part (a harmony message, a functionary_v3_2 part) whose body so far is `body`: named
// once, then its arguments sent as they grow when they are a JSON object, without the white space
// around it (ArgumentsText's reading).
void MessageStream::StreamPartCall(std::string_view name, std::string_view body, Delta* d) {
  if (!part_call_open_) {
    streamed_.push_back({streamed_.size(), std::string(name), ""});
    d->calls.push_back(streamed_.back());
    part_call_open_ = true;
  }
  const size_t lead = body.find_first_not_of(" \n\r\t");
  if (lead == std::string_view::npos || body[lead] != '{') return;
  const size_t end = body.find_last_not_of(" \n\r\t") + 1;
  const size_t from = lead + streamed_.back().arguments.size();
  if (end > from) SendArguments(body.substr(from, end - from), &d->calls);
}

void MessageStream::SendArguments(std::string_view piece, std::vector<CallDelta>* out) {
  if (piece.empty()) return;
  CallDelta& call = streamed_.back();
  call.arguments += piece;
  if (out->empty() || out->back().index != call.index) out->push_back({call.index, "", ""});
  out->back().arguments += piece;
}

// One Qwen3-Coder parameter of the call being streamed, or its end (ScanCalls): true to go on
// scanning, false to wait for more text (or stop).
bool MessageStream::ScanXmlParameter(std::string_view s, std::vector<CallDelta>* out) {
  // As CallFromXml reads them: a value ends at </parameter>, the next <parameter= or </function>.
  const size_t i = SkipSpace(s, scan_pos_);
  size_t at = i;
  const Found end = Expect(s, &at, "</function>");
  if (end == Found::kYes) {
    SendArguments(scan_any_param_ ? "}" : "{}", out);
    scan_pos_ = at;
    scan_ = Scan::kSeek;
    return true;
  }
  at = i;
  const Found param = Expect(s, &at, "<parameter=");
  if (param == Found::kNeedMore || end == Found::kNeedMore) return false;
  if (param == Found::kNo) {
    scan_ = Scan::kStopped;
    return false;
  }
  const size_t key_end = s.find('>', at);
  if (key_end == std::string_view::npos) return false;
  const size_t close = s.find("</parameter>", key_end);
  const size_t next = std::min({close, s.find("<parameter=", key_end), s.find("</function>", key_end)});
  if (next == std::string_view::npos) return false;
  const std::string key(Trim(s.substr(at, key_end - at)));
  std::string_view value = s.substr(key_end + 1, next - key_end - 1);
  if (!value.empty() && value.front() == '\n') value.remove_prefix(1);
  if (!value.empty() && value.back() == '\n') value.remove_suffix(1);
  const std::string type = DeclaredType(types_.get(), streamed_.back().name, key);
  SendArguments((scan_any_param_ ? "," : "{") + JsonText(Json(key)) + ":" + JsonText(XmlValue(value, type)), out);
  scan_any_param_ = true;
  scan_pos_ = next == close ? close + 12 : next;
  return true;
}

// One glm45 (minimax_m2) key/value pair of the call being streamed, or its end (ScanCalls): true to
// go on scanning, false to wait for more text (or stop).
bool MessageStream::ScanPair(std::string_view s, std::vector<CallDelta>* out) {
  // As CallFromGlm (CallFromInvoke) reads them: key/value pairs until </tool_call> (</invoke>).
  const bool minimax = *tools_ == ToolCallFormat::kMinimaxM2;
  size_t at = SkipSpace(s, scan_pos_);
  const Found end = Expect(s, &at, minimax ? kInvokeEnd : kHermesClose);
  if (end == Found::kYes) {
    SendArguments(scan_any_param_ ? "}" : "{}", out);
    scan_pos_ = at;
    scan_ = Scan::kSeek;
    return true;
  }
  std::string_view key, value;
  size_t next = 0;
  const Found pair = (minimax ? NamedParam : GlmPair)(s, scan_pos_, &key, &value, &next);
  if (pair == Found::kNeedMore || (pair == Found::kNo && end == Found::kNeedMore)) return false;
  if (pair == Found::kNo) {
    scan_ = Scan::kStopped;
    return false;
  }
  const std::string k(key);
  SendArguments((scan_any_param_ ? "," : "{") + JsonText(Json(k)) + ":" +
                    JsonText(GlmValue(value, DeclaredType(types_.get(), streamed_.back().name, k))),
                out);
  scan_any_param_ = true;
  scan_pos_ = next;
  return true;
}

void MessageStream::ScanCalls(std::vector<CallDelta>* out) {
  const std::string_view s = call_text_;
  while (scan_ != Scan::kStopped) {
    switch (scan_) {
      case Scan::kSeek: {
        const CallHeader h = FindCallHeader(*tools_, s, scan_pos_, streamed_.empty(), scan_array_);
        if (h.found == Found::kNeedMore) return;
        if (h.found == Found::kNo) {
          scan_ = Scan::kStopped;  // what follows goes whole at the end
          return;
        }
        streamed_.push_back({streamed_.size(), h.name, ""});
        out->push_back(streamed_.back());
        scan_pos_ = h.next;
        scan_wrapped_ = h.wrapped;
        scan_array_ = h.array;
        scan_depth_ = 0;
        scan_in_string_ = scan_escape_ = false;
        scan_any_param_ = false;
        scan_ = h.xml ? Scan::kXmlParameters : h.glm ? Scan::kGlmArguments : h.gemma ? Scan::kGemmaArguments : Scan::kJsonArguments;
        gemma_ = GemmaArgsReader();
        break;
      }
      case Scan::kGemmaArguments: {
        std::string piece;
        size_t i = scan_pos_;
        while (i < s.size() && gemma_.state() == GemmaArgsReader::State::kMore) gemma_.Feed(s[i++], &piece);
        scan_pos_ = i;
        SendArguments(piece, out);
        if (gemma_.state() == GemmaArgsReader::State::kMore) return;
        scan_ = gemma_.state() == GemmaArgsReader::State::kDone ? Scan::kCallEnd : Scan::kStopped;
        break;
      }
      case Scan::kCallEnd: {  // gemma4's <tool_call|>
        const Found end = Expect(s, &scan_pos_, kGemmaCallEnd);
        if (end == Found::kNeedMore) return;
        scan_ = Scan::kSeek;  // without it, the next call or the text's end
        break;
      }
      case Scan::kJsonArguments: {
        JsonScanState m{scan_in_string_, scan_escape_, scan_depth_};
        std::string piece;
        bool open = true;
        size_t i = scan_pos_;
        while (i < s.size() && open) open = JsonScanStep(&m, s[i++], &piece);
        scan_pos_ = i;
        scan_in_string_ = m.in_string;
        scan_escape_ = m.escape;
        scan_depth_ = m.depth;
        SendArguments(piece, out);
        if (open) return;
        scan_ = scan_wrapped_ ? Scan::kWrapperEnd : Scan::kSeek;
        break;
      }
      case Scan::kWrapperEnd: {
        const size_t i = SkipSpace(s, scan_pos_);
        if (i >= s.size()) return;
        if (s[i] != '}') {
          scan_ = Scan::kStopped;
          return;
        }
        scan_pos_ = i + 1;
        scan_ = Scan::kSeek;
        break;
      }
      case Scan::kXmlParameters:
        if (!ScanXmlParameter(s, out)) return;
        break;
      case Scan::kGlmArguments:
        if (!ScanPair(s, out)) return;
        break;
      case Scan::kStopped: break;
    }
  }
}

MessageStream::Delta MessageStream::Push(std::string_view text) {
  Delta d = PushText(text);
  // A forced answer is calls: text between them (the newlines after a thought) is not content.
  if (forced_calls_) d.content.clear();
  return d;
}

MessageStream::Delta MessageStream::PushText(std::string_view text) {
  Delta d;
  if (tools_ == ToolCallFormat::kGptOss) {
    // Harmony's headers say what each message is: each is sent as it is written.
    call_text_ += text;
    in_calls_ = true;
    ScanHarmony(&d);
    content_all_ += d.content;
    reasoning_all_ += d.reasoning;
    return d;
  }
  if (tools_ == ToolCallFormat::kFunctionaryV32) {
    // Functionary v3.2's recipients say what every part is: each is sent as it is written.
    call_text_ += text;
    in_calls_ = true;
    ScanFunctionaryV32(&d);
    content_all_ += d.content;
    return d;
  }
  std::string buf = pending_ + std::string(text);
  pending_.clear();
  while (!buf.empty()) {
    if (thinking_) {
      const size_t close = buf.find(reasoning_->close);
      if (close != std::string::npos) {
        d.reasoning += buf.substr(0, close);
        buf.erase(0, close + reasoning_->close.size());
        thinking_ = false;
        continue;
      }
      const size_t keep = PartialMarker(buf, reasoning_->close);
      d.reasoning += buf.substr(0, buf.size() - keep);
      pending_ = buf.substr(buf.size() - keep);
      break;
    }
    if (in_calls_) {
      call_text_ += buf;
      ScanCalls(&d.calls);
      break;
    }
    const std::string_view lead = Trim(buf);
    if (!seen_content_ && (lead.empty() || (reasoning_ && reasoning_->open.substr(0, lead.size()) == lead &&
                                            lead.size() < reasoning_->open.size()))) {
      pending_ = buf;  // only whitespace, or the start of the reasoning's marker, so far
      break;
    }
    if (!seen_content_ && reasoning_ && StartsWith(lead, reasoning_->open)) {
      // (Only the white space before the marker goes: what follows it is the reasoning's, even when
      // a piece ends with it.)
      buf.erase(0, buf.find_first_not_of(" \n\r\t") + reasoning_->open.size());
      thinking_ = true;
      continue;
    }
    if (tools_) {
      // A call starts at a marker, or (llama3_json, mistral) with the message's first bracket.
      size_t at = std::string::npos;
      for (std::string_view m : Markers(*tools_)) at = std::min(at, buf.find(m));
      if (!seen_content_ && ((*tools_ == ToolCallFormat::kLlama3Json && StartsWith(lead, "{")) ||
                             (*tools_ == ToolCallFormat::kMistral && StartsWith(lead, "[")))) {
        at = 0;
      }
      if (at != std::string::npos) {
        d.content += buf.substr(0, at);
        call_text_ = buf.substr(at);
        in_calls_ = true;
        ScanCalls(&d.calls);
        break;
      }
      size_t keep = 0;
      for (std::string_view m : Markers(*tools_)) keep = std::max(keep, PartialMarker(buf, m));
      d.content += buf.substr(0, buf.size() - keep);
      pending_ = buf.substr(buf.size() - keep);
    } else {
      d.content += buf;
    }
    break;
  }
  if (!Trim(d.content).empty()) seen_content_ = true;
  content_all_ += d.content;
  reasoning_all_ += d.reasoning;
  return d;
}

ParsedMessage MessageStream::Finish(std::vector<CallDelta>* rest) {
  ParsedMessage out;
  if (thinking_) {
    out.reasoning = pending_;
  } else if (in_calls_) {
    call_text_ += pending_;
  } else {
    out.content = pending_;
  }
  pending_.clear();
  if (in_calls_) {
    ParsedMessage p;
    if (tools_ == ToolCallFormat::kGptOss || tools_ == ToolCallFormat::kFunctionaryV32) {
      // What the stream sent of the content and reasoning is where they start (the same reading).
      p = tools_ == ToolCallFormat::kGptOss ? ParseHarmony(call_text_) : ParseFunctionaryV32(call_text_);
      p.content.erase(0, std::min(parts_content_, p.content.size()));
      p.reasoning.erase(0, std::min(parts_reasoning_, p.reasoning.size()));
    } else {
      p = ParseToolCalls(*tools_, call_text_, types_.get());
    }
    out.content += p.content;
    out.reasoning += p.reasoning;
    out.calls = std::move(p.calls);
    // What the stream has not sent: the rest of each call it began (the whole parse and the scan
    // read the same text the same way, so what was sent is the start of the arguments; where it
    // is not, as when a call began streaming and then did not parse, nothing more can be said),
    // then the calls it never saw.
    // A streamed call that did not parse after all (cut off, or not JSON) is skipped: the calls
    // after it keep their places.
    size_t k = 0, fresh = streamed_.size();
    for (size_t j = 0; rest != nullptr && j < out.calls.size(); ++j) {
      const ToolCall& c = out.calls[j];
      size_t m = k;
      while (m < streamed_.size() && !(streamed_[m].name == c.name && StartsWith(c.arguments, streamed_[m].arguments))) ++m;
      if (m == streamed_.size()) {
        rest->push_back({fresh++, c.name, c.arguments});
        continue;
      }
      if (c.arguments.size() > streamed_[m].arguments.size()) {
        rest->push_back({m, "", c.arguments.substr(streamed_[m].arguments.size())});
      }
      k = m + 1;
    }
    call_text_.clear();
    in_calls_ = false;
  }
  if (forced_calls_) out.content.clear();
  content_all_ += out.content;
  reasoning_all_ += out.reasoning;
  return out;
}

namespace {

// One parameter of a call in Qwen3-Coder's XML: its value is raw text (a string), one of some
// texts (a string enum), or JSON by a rule of the converted schema (anything else with one type).
struct XmlParam {
  std::string name;
  bool required = false;
  enum class Kind { kText, kChoice, kJson } kind = Kind::kText;
  std::vector<std::string> choices;  // kChoice
  Json schema;                       // kJson
};

// A list of types whose only non-null member is "string" (ParamTypesOf reads it as a string).
bool TypeListIsString(const Json& p) {
  if (!p.contains("type") || !p["type"].is_array()) return false;
  int strings = 0, others = 0;
  for (const Json& t : p["type"]) {
    if (t == "string") ++strings;
    else if (t != "null") ++others;
  }
  return strings > 0 && others == 0;
}

// A tool's parameters as XML parameters, or nothing when the schema says more than XML can hold
// (a string with a pattern, format or length, a union, a reference, keys beyond properties and
// required): that tool's calls are then JSON inside <tool_call>, which the parser also takes.
// value_end: what ends a value (a text value must not contain it). glm: values as GLM's
// <arg_value>s (and MiniMax's parameters) are read, every value not declared a string as JSON: a
// union or reference is then a JSON value (a nullable string, text); only a string with a pattern,
// format or length has no form. Names with <, >, a quote or a line break have none either.
std::optional<std::vector<XmlParam>> XmlParams(const Json& params, std::string_view value_end, bool glm) {
  static const std::vector<std::string> kObjectKeys = {"type", "properties", "required", "additionalProperties",
                                                       "description", "title", "$schema"};
  static const std::vector<std::string> kNotes = {"description", "title", "default", "examples"};
  if (!params.is_object()) return std::nullopt;
  for (auto it = params.begin(); it != params.end(); ++it) {
    if (std::find(kObjectKeys.begin(), kObjectKeys.end(), it.key()) == kObjectKeys.end()) return std::nullopt;
  }
  if (params.contains("type") && params["type"] != "object") return std::nullopt;
  const Json props = params.value("properties", Json::object());
  const Json required = params.value("required", Json::array());
  if (!props.is_object() || !required.is_array()) return std::nullopt;
  for (const Json& r : required) {
    if (!r.is_string() || !props.contains(r.get<std::string>())) return std::nullopt;
  }
  std::vector<XmlParam> out;
  for (auto it = props.begin(); it != props.end(); ++it) {
    const Json& p = it.value();
    if (!p.is_object() || it.key().empty() || it.key().find_first_of("<>\n\"") != std::string::npos) return std::nullopt;
    XmlParam x;
    x.name = it.key();
    x.required = std::find(required.begin(), required.end(), Json(it.key())) != required.end();
    const Json* values = p.contains("enum") ? &p["enum"] : nullptr;
    Json one;
    if (p.contains("const")) {
      one = Json::array({p["const"]});
      values = &one;
    }
    const bool only_notes = [&] {
      for (auto k = p.begin(); k != p.end(); ++k) {
        if (k.key() != "type" && k.key() != "enum" && k.key() != "const" &&
            std::find(kNotes.begin(), kNotes.end(), k.key()) == kNotes.end()) {
          return false;
        }
      }
      return true;
    }();
    if (values != nullptr && values->is_array() && !values->empty() && only_notes &&
        std::all_of(values->begin(), values->end(), [](const Json& v) { return v.is_string(); }) &&
        (!p.contains("type") || p["type"] == "string")) {
      x.kind = XmlParam::Kind::kChoice;
      for (const Json& v : *values) {
        if (v.get<std::string>().find(value_end) != std::string::npos) return std::nullopt;
        x.choices.push_back(v.get<std::string>());
      }
    } else if (p.contains("type") && p["type"] == "string") {
      if (!only_notes || values != nullptr) return std::nullopt;
      x.kind = XmlParam::Kind::kText;
    } else if (p.contains("type") && p["type"].is_string() && !p.contains("$ref") && !p.contains("anyOf") &&
               !p.contains("oneOf") && !p.contains("allOf")) {
      x.kind = XmlParam::Kind::kJson;  // integer, number, boolean, object, array, null
      x.schema = p;
    } else if (glm && TypeListIsString(p)) {
      // ["string", "null"]: the parser reads a string, so text (a subset: never null).
      if (!only_notes || values != nullptr) return std::nullopt;
      x.kind = XmlParam::Kind::kText;
    } else if (glm) {
      x.kind = XmlParam::Kind::kJson;  // a union, a reference, several types or none: JSON
      x.schema = p;
    } else {
      return std::nullopt;
    }
    out.push_back(std::move(x));
  }
  return out;
}

// The control tokens a format's calls are made of, as grammar elements: by id (<[N]>). gpt_oss's
// must be in the vocabulary; kimi_k2's are written as their text where it has no such token.
struct SyntaxTokens {
  std::string channel, constrain, message, call;                   // gpt_oss (harmony)
  std::string calls_begin, call_begin, args, call_end, calls_end;  // kimi_k2
  std::string quote;                                               // gemma4 (call_begin, call_end too)
};

StatusOr<SyntaxTokens> FindSyntaxTokens(ToolCallFormat f, const std::function<int32_t(std::string_view)>& token_id) {
  SyntaxTokens t;
  using Slot = std::pair<std::string_view, std::string*>;
  if (f == ToolCallFormat::kGptOss) {
    for (auto [text, out] : {Slot{"<|channel|>", &t.channel}, Slot{"<|constrain|>", &t.constrain},
                             Slot{"<|message|>", &t.message}, Slot{"<|call|>", &t.call}}) {
      const int32_t id = token_id ? token_id(text) : -1;
      if (id < 0) return InvalidArgument("tool_choice: the vocabulary has no {} token for gpt_oss's calls", text);
      *out = fmt::format("<[{}]>", id);
    }
    return t;
  }
  // kimi_k2's and gemma4's markers: by id where the vocabulary has them, else as text.
  std::vector<Slot> slots;
  if (f == ToolCallFormat::kKimiK2) {
    slots = {Slot{kKimiCallsBegin, &t.calls_begin}, Slot{kKimiCallBegin, &t.call_begin}, Slot{kKimiArgs, &t.args},
             Slot{kKimiCallEnd, &t.call_end}, Slot{kKimiCallsEnd, &t.calls_end}};
  } else if (f == ToolCallFormat::kGemma4) {
    slots = {Slot{kGemmaCallOpen, &t.call_begin}, Slot{kGemmaCallEnd, &t.call_end}, Slot{kGemmaQuote, &t.quote}};
  }
  for (auto [text, out] : slots) {
    const int32_t id = token_id ? token_id(text) : -1;
    *out = id >= 0 ? fmt::format("<[{}]>", id) : grammar::GbnfLiteral(text);
  }
  return t;
}

// A tool's parameters with its local references pointing into the combined $defs (prefix +
// "params" for the root, prefix + "d-" + name for its own definitions, which move there).
Json AbsorbDefinitions(Json params, const std::string& prefix, Json& defs) {
  std::vector<Json*> todo = {&params};
  while (!todo.empty()) {
    Json* n = todo.back();
    todo.pop_back();
    if (n->is_object()) {
      for (auto it = n->begin(); it != n->end(); ++it) {
        if (it.key() == "$ref" && it.value().is_string()) {
          std::string ref = it.value().get<std::string>();
          if (ref == "#") {
            ref = "#/$defs/" + prefix + "params";
          } else if (StartsWith(ref, "#/$defs/") || StartsWith(ref, "#/definitions/")) {
            ref = "#/$defs/" + prefix + "d-" + ref.substr(ref.find('/', 2) + 1);
          }
          it.value() = ref;
        } else {
          todo.push_back(&it.value());
        }
      }
    } else if (n->is_array()) {
      for (auto& e : *n) todo.push_back(&e);
    }
  }
  for (const char* key : {"$defs", "definitions"}) {
    if (params.is_object() && params.contains(key) && params[key].is_object()) {
      for (auto it = params[key].begin(); it != params[key].end(); ++it) defs[prefix + "d-" + it.key()] = it.value();
      params.erase(key);
    }
  }
  return params;
}

// A value in Gemma 4's syntax, by its schema: a string (free text or one of some), a JSON-syntax
// scalar (a number, boolean or null: the rule of the converted schema), an object of declared
// members, an array of one kind of item, or any value at all (the schema says nothing more).
struct GemmaNode {
  enum class Kind { kText, kChoice, kJson, kObject, kArray, kAny, kAnyObject, kAnyArray } kind = Kind::kAny;
  bool nullable = false;
  std::vector<std::string> choices;                        // kChoice
  std::string rule;                                        // kJson
  std::vector<std::string> keys;                           // kObject, in the template's order
  std::vector<GemmaNode> members;                          // kObject, per key
  std::vector<bool> required;                              // kObject, per key
  std::vector<GemmaNode> item;                             // kArray: its one element
};

// Reads a tool's parameter schema as Gemma 4 values (GemmaNode); scalars' schemas go into defs
// (named prefix + "v" + a count, listed in any_of so the conversion writes their rules). What
// the syntax cannot hold or check is refused, naming the place: a string with a pattern, format
// or length, unions, references, open objects with declared members, array bounds.
class GemmaShaper {
 public:
  GemmaShaper(std::string prefix, Json* defs, Json* any_of) : prefix_(std::move(prefix)), defs_(defs), any_of_(any_of) {}
  StatusOr<GemmaNode> Shape(const Json& s, const std::string& at, int depth = 0);

 private:
  StatusOr<GemmaNode> Object(const Json& s, const std::string& at, int depth);
  static Status Refuse(const std::string& at, std::string_view what) {
    return InvalidArgument("{}: {} cannot be written in gemma4's call syntax", at.empty() ? "the parameters" : at, what);
  }
  GemmaNode Scalar(const Json& s) {
    GemmaNode n;
    n.kind = GemmaNode::Kind::kJson;
    n.rule = fmt::format("{}v{}", prefix_, count_++);
    (*defs_)[n.rule] = s;
    any_of_->push_back({{"$ref", "#/$defs/" + n.rule}});
    return n;
  }
  std::string prefix_;
  Json* defs_;
  Json* any_of_;
  int count_ = 0;
};

StatusOr<GemmaNode> GemmaShaper::Shape(const Json& s, const std::string& at, int depth) {
  static const std::vector<std::string> kNotes = {"description", "title", "default", "examples", "$schema"};
  static const std::vector<std::string> kKnown = {"type", "enum", "const", "properties", "required", "additionalProperties",
                                                  "items", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"};
  auto refuse = [&](std::string_view what) { return Refuse(at, what); };
  if (depth > kMaxArgumentDepth) return refuse("a schema this deep");
  if (s.is_boolean() && s.get<bool>()) return GemmaNode{};
  if (!s.is_object()) return refuse("this schema");
  Json core = Json::object();
  for (auto it = s.begin(); it != s.end(); ++it) {
    if (std::find(kNotes.begin(), kNotes.end(), it.key()) != kNotes.end()) continue;
    if (std::find(kKnown.begin(), kKnown.end(), it.key()) == kKnown.end()) return refuse("'" + it.key() + "'");
    core[it.key()] = it.value();
  }
  if (core.empty()) return GemmaNode{};
  std::string type;
  bool nullable = false;
  if (core.contains("type") && core["type"].is_array()) {
    for (const Json& t : core["type"]) {
      if (t == "null") {
        nullable = true;
      } else if (t.is_string() && type.empty()) {
        type = t.get<std::string>();
      } else {
        return refuse("a union of types");
      }
    }
  } else if (core.contains("type")) {
    if (!core["type"].is_string()) return refuse("this 'type'");
    type = core["type"].get<std::string>();
  } else if (core.contains("properties")) {
    type = "object";
  } else if (core.contains("items")) {
    type = "array";
  }
  GemmaNode n;
  const Json* values = core.contains("enum") ? &core["enum"] : nullptr;
  Json one;
  if (core.contains("const")) {
    one = Json::array({core["const"]});
    values = &one;
  }
  if (values != nullptr) {
    if (!values->is_array() || values->empty()) return refuse("this 'enum'");
    if (std::all_of(values->begin(), values->end(), [](const Json& v) { return v.is_string(); })) {
      n.kind = GemmaNode::Kind::kChoice;
      for (const Json& v : *values) {
        if (v.get<std::string>().find(kGemmaQuote) != std::string::npos) return refuse("a value holding <|\"|>");
        n.choices.push_back(v.get<std::string>());
      }
    } else if (std::all_of(values->begin(), values->end(), [](const Json& v) { return v.is_primitive(); }) &&
               std::none_of(values->begin(), values->end(), [](const Json& v) { return v.is_string(); })) {
      n = Scalar(s);
    } else {
      return refuse("an enum of strings and other values");
    }
  } else if (type == "string") {
    for (auto it = core.begin(); it != core.end(); ++it) {
      if (it.key() != "type") return refuse("'" + it.key() + "' on a string");
    }
    n.kind = GemmaNode::Kind::kText;
  } else if (type == "integer" || type == "number" || type == "boolean" || type == "null") {
    Json scalar = core;
    scalar["type"] = type;
    n = Scalar(scalar);
  } else if (type == "object") {
    ASSIGN_OR_RETURN(n, Object(core, at, depth));
  } else if (type == "array") {
    for (auto it = core.begin(); it != core.end(); ++it) {
      if (it.key() != "type" && it.key() != "items") return refuse("'" + it.key() + "' on an array");
    }
    n.kind = GemmaNode::Kind::kAnyArray;
    if (core.contains("items")) {
      ASSIGN_OR_RETURN(GemmaNode item, Shape(core["items"], at + "[]", depth + 1));
      n.kind = GemmaNode::Kind::kArray;
      n.item.push_back(std::move(item));
    }
  } else {
    return refuse(type.empty() ? "a schema without a type" : "type '" + type + "'");
  }
  n.nullable = n.nullable || nullable;
  return n;
}

StatusOr<GemmaNode> GemmaShaper::Object(const Json& core, const std::string& at, int depth) {
  auto refuse = [&](std::string_view what) { return Refuse(at, what); };
  for (auto it = core.begin(); it != core.end(); ++it) {
    if (it.key() != "type" && it.key() != "properties" && it.key() != "required" && it.key() != "additionalProperties") {
      return refuse("'" + it.key() + "' on an object");
    }
  }
  GemmaNode n;
  const Json props = core.value("properties", Json::object());
  const Json required = core.value("required", Json::array());
  const Json extra = core.value("additionalProperties", Json());
  if (!props.is_object() || !required.is_array()) return refuse("these 'properties' or 'required'");
  // No members declared: any object, unless other keys are closed out (gale closes an object
  // that declares its properties, even none, as OpenAI's strict mode does).
  if (!core.contains("properties") && required.empty() && (extra.is_null() || extra == true)) {
    n.kind = GemmaNode::Kind::kAnyObject;
    return n;
  }
  if (!extra.is_null() && extra != false) return refuse("other keys beside declared ones");
  n.kind = GemmaNode::Kind::kObject;
  for (const Json& r : required) {
    if (!r.is_string() || !props.contains(r.get<std::string>())) return refuse("a required key it does not declare");
  }
  std::vector<std::string> keys;
  for (auto it = props.begin(); it != props.end(); ++it) keys.push_back(it.key());
  // The template writes keys sorted as Jinja's dictsort does: case folded, stable.
  auto folded = [](std::string k) {
    for (char& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return k;
  };
  std::stable_sort(keys.begin(), keys.end(), [&](const std::string& a, const std::string& b) { return folded(a) < folded(b); });
  for (const std::string& k : keys) {
    if (k.empty() || k.find_first_of(":,{}[]<>\"\n\t ") != std::string::npos) return refuse("the key '" + k + "'");
    ASSIGN_OR_RETURN(GemmaNode m, Shape(props[k], at.empty() ? k : at + "." + k, depth + 1));
    n.keys.push_back(k);
    n.members.push_back(std::move(m));
    n.required.push_back(std::find(required.begin(), required.end(), Json(k)) != required.end());
  }
  return n;
}

// Writes a GemmaNode's grammar: Value gives its expression, adding rules (named from `name`) to
// *rules; the rules for any value are written once, when first needed.
class GemmaRules {
 public:
  GemmaRules(const SyntaxTokens& t, std::string* rules) : q_(t.quote), rules_(rules) {}
  std::string Value(const GemmaNode& n, const std::string& name);

 private:
  std::string Text() {
    if (!text_) *rules_ += grammar::TextWithoutGbnf("gemma-text", std::string(kGemmaQuote));
    text_ = true;
    return q_ + " gemma-text-0 " + q_;
  }
  std::string Any();
  const std::string q_;
  std::string* rules_;
  bool text_ = false, any_ = false;
};

std::string GemmaRules::Any() {
  if (!any_) {
    *rules_ += "gemma-value ::= gemma-string | gemma-object | gemma-array | gemma-number | \"true\" | \"false\" | \"null\"\n";
    *rules_ += "gemma-string ::= " + Text() + "\n";
    *rules_ += "gemma-object ::= \"{\" (gemma-member (\",\" gemma-member)*)? \"}\"\n";
    *rules_ += "gemma-member ::= [^:{}\\[\\],<\"\\n ]+ \":\" gemma-value\n";
    *rules_ += "gemma-array ::= \"[\" (gemma-value (\",\" gemma-value)*)? \"]\"\n";
    *rules_ += "gemma-number ::= \"-\"? ([0-9] | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n";
  }
  any_ = true;
  return "gemma-value";
}

std::string GemmaRules::Value(const GemmaNode& n, const std::string& name) {
  std::string v;
  switch (n.kind) {
    case GemmaNode::Kind::kText: v = Text(); break;
    case GemmaNode::Kind::kChoice:
      for (const std::string& c : n.choices) v += (v.empty() ? "(" : " | ") + grammar::GbnfLiteral(c);
      v = q_ + " " + v + ") " + q_;
      break;
    case GemmaNode::Kind::kJson: v = n.rule; break;
    case GemmaNode::Kind::kAny: v = Any(); break;
    case GemmaNode::Kind::kAnyObject: Any(); v = "gemma-object"; break;
    case GemmaNode::Kind::kAnyArray: Any(); v = "gemma-array"; break;
    case GemmaNode::Kind::kArray: {
      const std::string item = Value(n.item[0], name + "-i");
      v = fmt::format("\"[\" ({} (\",\" {})*)? \"]\"", item, item);
      break;
    }
    case GemmaNode::Kind::kObject: {
      // Members in order, optional ones left out, a comma between two written: head<k> starts at
      // member k with none written yet, tail<k> after one was.
      const size_t m = n.members.size();
      for (size_t k = m; k-- > 0;) {
        const std::string member =
            grammar::GbnfLiteral(n.keys[k] + ":") + " " + Value(n.members[k], fmt::format("{}-{}", name, k));
        const std::string tail_next = k + 1 < m ? fmt::format("{}-t{}", name, k + 1) : "";
        const std::string head_next = k + 1 < m ? fmt::format("{}-h{}", name, k + 1) : "";
        *rules_ += fmt::format("{}-t{} ::= {}\n", name, k,
                               n.required[k] ? fmt::format("\",\" {} {}", member, tail_next)
                                             : fmt::format("(\",\" {})? {}", member, tail_next));
        *rules_ += fmt::format("{}-h{} ::= {}\n", name, k,
                               n.required[k] ? fmt::format("{} {}", member, tail_next)
                                             : fmt::format("{} {} | {}", member, tail_next, head_next.empty() ? "\"\"" : head_next));
      }
      v = m == 0 ? "\"{}\"" : fmt::format("\"{{\" {}-h0 \"}}\"", name);
      break;
    }
  }
  return n.nullable ? "(" + v + " | \"null\")" : v;
}

// The tools a call may name. Every chosen tool's parameters go into one schema's $defs, so one
// conversion writes all argument rules: tool<i>-params (qwen3_coder's XML parameters with JSON
// values also tool<i>-p<k>).
struct ChosenTools {
  Json combined = {{"$defs", Json::object()}, {"anyOf", Json::array()}};
  std::vector<std::string> names;
  std::vector<std::optional<std::vector<XmlParam>>> xml;  // qwen3_coder, glm45: each tool's parameters
  std::vector<GemmaNode> gemma;                           // gemma4: each tool's parameters
};

StatusOr<ChosenTools> ChooseTools(ToolCallFormat f, const nlohmann::ordered_json& tools, const std::string& name) {
  ChosenTools c;
  for (size_t i = 0; i < tools.size(); ++i) {
    const Json& t = tools[i];
    if (!t.is_object() || !t.contains("function") || !t["function"].is_object()) continue;
    const Json& fn = t["function"];
    if (!fn.contains("name") || !fn["name"].is_string()) return InvalidArgument("tools[{}] has no function name", i);
    const std::string fname = fn["name"].get<std::string>();
    if (!name.empty() && fname != name) continue;
    const std::string prefix = fmt::format("tool{}-", c.names.size());
    const Json params = AbsorbDefinitions(fn.contains("parameters") && !fn["parameters"].is_null()
                                              ? fn["parameters"]
                                              : Json{{"type", "object"}, {"properties", Json::object()}},
                                          prefix, c.combined["$defs"]);
    if (f == ToolCallFormat::kQwen3Coder || f == ToolCallFormat::kGlm45 || f == ToolCallFormat::kMinimaxM2) {
      const bool pairs = f != ToolCallFormat::kQwen3Coder;  // every value not a string is JSON
      c.xml.push_back(XmlParams(params, f == ToolCallFormat::kGlm45   ? kGlmValueEnd
                                        : f == ToolCallFormat::kMinimaxM2 ? kParamEnd
                                                                          : std::string_view("\n</parameter>"),
                                pairs));
      if (pairs && (!c.xml.back() || fname.find_first_of("<>\n\"") != std::string::npos)) {
        return InvalidArgument("tool '{}': its parameters cannot be written as {}'s key/value pairs (a string with a "
                               "pattern, format or length, keys beyond properties and required, or a name with "
                               "<, >, a quote or a line break)",
                               fname, ToolCallFormatName(f));
      }
      for (size_t k = 0; c.xml.back() && k < c.xml.back()->size(); ++k) {
        const XmlParam& x = (*c.xml.back())[k];
        if (x.kind != XmlParam::Kind::kJson) continue;
        const std::string def = fmt::format("{}p{}", prefix, k);
        c.combined["$defs"][def] = x.schema;
        c.combined["anyOf"].push_back({{"$ref", "#/$defs/" + def}});
      }
    }
    if (f == ToolCallFormat::kGemma4) {
      if (!IsGemmaName(fname)) return InvalidArgument("tool '{}': its name cannot be written in gemma4's call syntax", fname);
      GemmaShaper shaper(prefix, &c.combined["$defs"], &c.combined["anyOf"]);
      auto shape = shaper.Shape(params, "");
      if (!shape.ok()) return InvalidArgument("tool '{}': {}", fname, shape.status().message());
      c.gemma.push_back(std::move(*shape));
      c.names.push_back(fname);
      continue;
    }
    c.combined["$defs"][prefix + "params"] = params;
    c.combined["anyOf"].push_back({{"$ref", "#/$defs/" + prefix + "params"}});
    c.names.push_back(fname);
  }
  if (c.names.empty()) {
    return name.empty() ? InvalidArgument("tool_choice needs at least one function in 'tools'")
                        : InvalidArgument("tool_choice names function '{}', which is not in 'tools'", name);
  }
  return c;
}

// The GBNF for parameter k of tool i's value: free text up to `end` (its rule appended to
// *rules), one of the string choices, or the JSON rule tool<i>-p<k> of the combined schema.
std::string ParamValue(const XmlParam& x, size_t i, size_t k, const std::string& rule, const std::string& end,
                       std::string* rules) {
  std::string value;
  switch (x.kind) {
    case XmlParam::Kind::kText:
      *rules += grammar::TextWithoutGbnf(rule + "-text", end);
      return rule + "-text-0";
    case XmlParam::Kind::kChoice:
      for (const std::string& c : x.choices) value += (value.empty() ? "(" : " | ") + grammar::GbnfLiteral(c);
      return value + ")";
    case XmlParam::Kind::kJson: return fmt::format("tool{}-p{}", i, k);
  }
  return value;
}

// qwen3_coder's XML call of tool i: <function=NAME>\n, then each parameter in declaration order
// (optional ones may be left out) as <parameter=P>\nVALUE\n</parameter>\n, then </function>. The
// parameters' rules are appended to *rules.
std::string XmlCallBody(size_t i, const std::string& name, const std::vector<XmlParam>& params, std::string* rules) {
  std::string body = grammar::GbnfLiteral("<function=" + name + ">\n");
  for (size_t k = 0; k < params.size(); ++k) {
    const XmlParam& x = params[k];
    const std::string rule = fmt::format("tool{}-x{}", i, k);
    const std::string value = ParamValue(x, i, k, rule, "\n</parameter>", rules);
    *rules += fmt::format("{} ::= {} {} {}\n", rule, grammar::GbnfLiteral("<parameter=" + x.name + ">\n"), value,
                          grammar::GbnfLiteral("\n</parameter>\n"));
    body += " " + rule + (x.required ? "" : "?");
  }
  return body + " " + grammar::GbnfLiteral("</function>");
}

// glm45's call of tool i (the text between <tool_call> and </tool_call>): NAME, then each
// parameter in declaration order (optional ones may be left out) as <arg_key>P</arg_key>
// <arg_value>VALUE</arg_value>, a line break after the name and each tag allowed (GLM-4.5/4.6
// write them, 4.7 does not). The parameters' rules are appended to *rules.
std::string GlmCallBody(size_t i, const std::string& name, const std::vector<XmlParam>& params, std::string* rules) {
  std::string body = grammar::GbnfLiteral(name) + " \"\\n\"?";
  for (size_t k = 0; k < params.size(); ++k) {
    const XmlParam& x = params[k];
    const std::string rule = fmt::format("tool{}-g{}", i, k);
    const std::string value = ParamValue(x, i, k, rule, std::string(kGlmValueEnd), rules);
    *rules += fmt::format("{} ::= {} \"\\n\"? {} {} {} \"\\n\"?\n", rule,
                          grammar::GbnfLiteral(std::string(kGlmKey) + x.name + std::string(kGlmKeyEnd)),
                          grammar::GbnfLiteral(kGlmValue), value, grammar::GbnfLiteral(kGlmValueEnd));
    body += " " + rule + (x.required ? "" : "?");
  }
  return body;
}

// minimax_m2's call of tool i: <invoke name="NAME">, then each parameter in declaration order
// (optional ones may be left out) as <parameter name="P">VALUE</parameter>, then </invoke>, a line
// break after the opening tag and each parameter allowed (MiniMax-M2's template writes them).
std::string InvokeCallBody(size_t i, const std::string& name, const std::vector<XmlParam>& params, std::string* rules) {
  std::string body = grammar::GbnfLiteral(std::string(kInvoke) + "\"" + name + "\">") + " \"\\n\"?";
  for (size_t k = 0; k < params.size(); ++k) {
    const XmlParam& x = params[k];
    const std::string rule = fmt::format("tool{}-m{}", i, k);
    const std::string value = ParamValue(x, i, k, rule, std::string(kParamEnd), rules);
    *rules += fmt::format("{} ::= {} {} {} \"\\n\"?\n", rule,
                          grammar::GbnfLiteral(std::string(kNamedParam) + "\"" + x.name + "\">"), value,
                          grammar::GbnfLiteral(kParamEnd));
    body += " " + rule + (x.required ? "" : "?");
  }
  return body + " " + grammar::GbnfLiteral(kInvokeEnd);
}

// One call of tool i in the format's syntax, its arguments the rule tool<i>-params.
std::string CallBody(ToolCallFormat f, size_t i, const ChosenTools& c, const SyntaxTokens& h, std::string* rules,
                     GemmaRules* gemma) {
  const std::string& name = c.names[i];
  const std::string args = fmt::format("tool{}-params", i);
  switch (f) {
    case ToolCallFormat::kDeepSeekV3:
      return grammar::GbnfLiteral(std::string(kDsCallBegin) + name + std::string(kDsSep)) + " " + args + " " +
             grammar::GbnfLiteral(kDsCallEnd);
    case ToolCallFormat::kKimiK2:  // the id's index: the template counts calls over the conversation
      return h.call_begin + " " + grammar::GbnfLiteral("functions." + name + ":") + " [0-9]{1,4} " + h.args + " " + args +
             " " + h.call_end;
    case ToolCallFormat::kFunctionary:
      return grammar::GbnfLiteral("<function=" + name + ">") + " " + args + " " + grammar::GbnfLiteral("</function>");
    case ToolCallFormat::kFunctionaryV32:  // the prompt ends with ">>>"
      return grammar::GbnfLiteral(name + "\n") + " " + args;
    case ToolCallFormat::kGptOss:
      return h.channel + " " + grammar::GbnfLiteral("commentary to=functions." + name + " ") + " " + h.constrain + " " +
             grammar::GbnfLiteral("json") + " " + h.message + " " + args + " " + h.call;
    case ToolCallFormat::kGemma4:
      return h.call_begin + " " + grammar::GbnfLiteral("call:" + name) + " " +
             gemma->Value(c.gemma[i], fmt::format("tool{}-gemma", i)) + " " + h.call_end;
    case ToolCallFormat::kGlm45: return GlmCallBody(i, name, *c.xml[i], rules);
    case ToolCallFormat::kMinimaxM2: return InvokeCallBody(i, name, *c.xml[i], rules);
    case ToolCallFormat::kQwen3Coder:
      if (c.xml[i]) return XmlCallBody(i, name, *c.xml[i], rules);
      [[fallthrough]];
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kMistral:
    case ToolCallFormat::kLlama3Json: {
      const char* key = f == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
      const std::string quoted = JsonText(Json(name));
      return "\"{\" space " + grammar::GbnfLiteral("\"name\"") + " space \":\" space " + grammar::GbnfLiteral(quoted) +
             " space \",\" space " + grammar::GbnfLiteral(fmt::format("\"{}\"", key)) + " space \":\" space " + args +
             " \"}\" space";
    }
  }
  return "";
}

// The calls around tool_call_one: more calls after the first only when `many` (parallel calls
// allowed and no function named), at most kMaxParallelToolCalls in all; then the grammar is
// complete and generation ends.
std::string RootRules(ToolCallFormat f, bool many, const SyntaxTokens& t) {
  const std::string more = fmt::format("{{0,{}}}", kMaxParallelToolCalls - 1);
  switch (f) {
    case ToolCallFormat::kGptOss:  // one call: generation ends at <|call|>
      return "root ::= tool_call_one\n";
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kQwen3Coder:
      // Qwen3-Coder's XML parameters are free text; JSON inside <tool_call> is parsed as well.
      return "tool_block ::= \"<tool_call>\\n\" tool_call_one \"\\n</tool_call>\"\n" +
             fmt::format("root ::= tool_block{}\n", many ? " (\"\\n\" tool_block)" + more : "");
    case ToolCallFormat::kGlm45:
      return "tool_block ::= \"<tool_call>\" tool_call_one \"</tool_call>\"\n" +
             fmt::format("root ::= tool_block{}\n", many ? " (\"\\n\"? tool_block)" + more : "");
    case ToolCallFormat::kMinimaxM2:  // several <invoke>s in one block, as the template writes them
      return fmt::format("root ::= {} tool_call_one{} {}\n", grammar::GbnfLiteral(std::string(kMinimaxOpen) + "\n"),
                         many ? " (\"\\n\" tool_call_one)" + more : "",
                         grammar::GbnfLiteral("\n" + std::string(kMinimaxClose)));
    case ToolCallFormat::kLlama3Json:
      return fmt::format("root ::= tool_call_one{}\n", many ? " (\";\" \" \"? tool_call_one)" + more : "");
    case ToolCallFormat::kMistral:
      return fmt::format("root ::= \"[\" tool_call_one{} \"]\"\n", many ? " (\",\" \" \"? tool_call_one)" + more : "");
    case ToolCallFormat::kFunctionary:
      return fmt::format("root ::= tool_call_one{}\n", many ? " (\"\\n\"? tool_call_one)" + more : "");
    case ToolCallFormat::kFunctionaryV32:
      return fmt::format("root ::= tool_call_one{}\n", many ? " (\">>>\" tool_call_one)" + more : "");
    case ToolCallFormat::kDeepSeekV3:
      return fmt::format("root ::= {} tool_call_one{} {}\n", grammar::GbnfLiteral(kDsCallsBegin),
                         many ? " tool_call_one" + more : "", grammar::GbnfLiteral(kDsCallsEnd));
    case ToolCallFormat::kKimiK2:
      return fmt::format("root ::= {} tool_call_one{} {}\n", t.calls_begin, many ? " tool_call_one" + more : "", t.calls_end);
    case ToolCallFormat::kGemma4: return fmt::format("root ::= tool_call_one{}\n", many ? " tool_call_one" + more : "");
  }
  return "";
}

}  // namespace

StatusOr<std::string> ToolCallGrammar(ToolCallFormat f, const nlohmann::ordered_json& tools, const std::string& name,
                                      bool parallel, const std::function<int32_t(std::string_view)>& token_id) {
  ASSIGN_OR_RETURN(const SyntaxTokens tokens, FindSyntaxTokens(f, token_id));
  ASSIGN_OR_RETURN(const ChosenTools chosen, ChooseTools(f, tools, name));
  std::string out;
  if (!chosen.combined["anyOf"].empty()) {  // (gemma4's tools may have no JSON-syntax values)
    auto rules = grammar::JsonSchemaToGbnf(chosen.combined, "tool_arguments_any");
    if (!rules.ok()) return InvalidArgument("tool parameters: {}", rules.status().message());
    out = std::move(*rules);
  }
  std::string any;
  GemmaRules gemma(tokens, &out);
  for (size_t i = 0; i < chosen.names.size(); ++i) {
    const std::string body = CallBody(f, i, chosen, tokens, &out, &gemma);
    out += fmt::format("tool_call_{} ::= {}\n", i, body);
    any += (any.empty() ? "" : " | ") + fmt::format("tool_call_{}", i);
  }
  out += "tool_call_one ::= " + any + "\n";
  return out + RootRules(f, parallel && name.empty(), tokens);
}

}  // namespace gale::server
