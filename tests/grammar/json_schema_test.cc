// JSON Schema -> GBNF (src/grammar/json_schema.h): what each keyword lets through and refuses,
// checked by matching texts byte by byte; the refusals name the schema path.
#include "grammar/json_schema.h"

#include <map>
#include <memory>

#include <gtest/gtest.h>

#include "grammar/matcher.h"
#include "../grammar/byte_trie.h"

namespace gale::grammar {
namespace {

using Json = nlohmann::ordered_json;

struct Case {
  const char* schema;
  std::vector<const char*> good, bad;
};

bool Accepts(const CompiledGrammar* c, const std::string& text) {
  return test::AcceptsText(std::shared_ptr<const CompiledGrammar>(std::shared_ptr<const CompiledGrammar>{}, c), text);
}

// A schema's grammar compiled over single bytes; null (the failure reported) when it does not
// convert or parse.
std::unique_ptr<CompiledGrammar> CompileSchema(const Json& schema) {
  auto gbnf = JsonSchemaToGbnf(schema);
  if (!gbnf.ok()) {
    ADD_FAILURE() << schema.dump() << ": " << gbnf.status().message();
    return nullptr;
  }
  auto g = ParseGbnf(*gbnf);
  if (!g.ok()) {
    ADD_FAILURE() << schema.dump() << ": " << g.status().message() << "\n" << *gbnf;
    return nullptr;
  }
  return std::make_unique<CompiledGrammar>(std::move(*g), test::ByteTrie());
}

// The text without whitespace outside string literals: the compact JSON the grammars write.
std::string Compact(const std::string& text) { return grammar::CompactJsonText(text); }

// Two decimal texts ("-"?, digits, "." digits?) compared exactly: <0, 0, >0.
int CompareDecimal(std::string_view a, std::string_view b) {
  struct D {
    bool neg;
    std::string whole, frac;
  };
  auto parse = [](std::string_view t) {
    D d{!t.empty() && t[0] == '-', "", ""};
    if (d.neg) t.remove_prefix(1);
    const size_t dot = t.find('.');
    d.whole = std::string(t.substr(0, dot));
    if (dot != std::string_view::npos) d.frac = std::string(t.substr(dot + 1));
    d.whole.erase(0, d.whole.find_first_not_of('0') == std::string::npos ? d.whole.size() : d.whole.find_first_not_of('0'));
    while (!d.frac.empty() && d.frac.back() == '0') d.frac.pop_back();
    if (d.whole.empty() && d.frac.empty()) d.neg = false;
    return d;
  };
  const D x = parse(a), y = parse(b);
  auto magnitude = [](const D& p, const D& q) {
    if (p.whole.size() != q.whole.size()) return p.whole.size() < q.whole.size() ? -1 : 1;
    if (int c = p.whole.compare(q.whole)) return c < 0 ? -1 : 1;
    if (int c = p.frac.compare(q.frac)) return c < 0 ? -1 : 1;  // no trailing zeros: string order is value order
    return 0;
  };
  if (x.neg != y.neg) return x.neg ? -1 : 1;
  return x.neg ? -magnitude(x, y) : magnitude(x, y);
}

// Numbers within bounds of every kind (negative, fractional, exclusive, one-sided, a single
// point): the grammar accepts a decimal text exactly when its value is within them (checked by
// exact decimal comparison over numbers around the bounds; exponents and "-0" are not written).
TEST(JsonSchema, NumberBoundsAcceptExactlyTheNumbersWithin) {
  struct Bounds {
    const char *lo, *hi;
    bool lo_strict, hi_strict;
  };
  const std::vector<Bounds> bounds = {
      {"-1.5", "2.25", false, false}, {"0", nullptr, true, false},        {"0", "1", false, true},
      {"0.1", "0.1", false, false},   {"-10", "-0.5", false, false},      {"-0.05", "0.05", true, true},
      {nullptr, "3.14159", false, false}, {"0.001", nullptr, false, false}, {"12.5", "130.75", false, false},
      {nullptr, "-2", false, true},   {"9.99", "10.01", true, false}};
  std::vector<std::string> numbers;
  for (const char* whole : {"0", "1", "2", "3", "9", "10", "12", "13", "99", "100", "129", "130", "131"}) {
    for (const char* frac : {"", "0", "00", "001", "0009", "05", "049", "051", "1", "14159", "141589", "1416", "2", "25",
                             "250", "251", "24999", "5", "49", "51", "75", "749", "751", "9", "99", "999", "01"}) {
      for (const char* sign : {"", "-"}) numbers.push_back(std::string(sign) + whole + (*frac ? "." : "") + frac);
    }
  }
  for (const Bounds& b : bounds) {
    Json schema = {{"type", "number"}};
    if (b.lo) schema[b.lo_strict ? "exclusiveMinimum" : "minimum"] = Json::parse(b.lo);
    if (b.hi) schema[b.hi_strict ? "exclusiveMaximum" : "maximum"] = Json::parse(b.hi);
    SCOPED_TRACE(schema.dump());
    const auto compiled = CompileSchema(schema);
    ASSERT_NE(compiled, nullptr);
    int within = 0;
    for (const std::string& n : numbers) {
      if (n[0] == '-' && CompareDecimal(n, "0") == 0) continue;  // "-0": JSON, but not written
      const bool in = (!b.lo || (b.lo_strict ? CompareDecimal(n, b.lo) > 0 : CompareDecimal(n, b.lo) >= 0)) &&
                      (!b.hi || (b.hi_strict ? CompareDecimal(n, b.hi) < 0 : CompareDecimal(n, b.hi) <= 0));
      within += in;
      EXPECT_EQ(Accepts(compiled.get(), n), in) << n;
    }
    EXPECT_GT(within, 0);
  }
}

// multipleOf p/10^k: the grammar accepts a decimal text exactly when its value times 10^k is an
// integer multiple of p (with bounds for the powers of ten, which compose with them).
TEST(JsonSchema, MultiplesAcceptExactlyTheMultiples) {
  struct Multiple {
    const char* m;
    int64_t p;
    int k;
    const char *lo, *hi;
  };
  const std::vector<Multiple> multiples = {{"0.01", 1, 2, nullptr, nullptr}, {"0.01", 1, 2, "-2.5", "130.75"},
                                           {"0.1", 1, 1, "0.05", nullptr},   {"1", 1, 0, "-3.5", "12.5"},
                                           {"7", 7, 0, nullptr, nullptr},    {"0.25", 25, 2, nullptr, nullptr},
                                           {"1.5", 15, 1, nullptr, nullptr}, {"12", 12, 0, nullptr, nullptr}};
  auto is_multiple = [](const std::string& n, int64_t p, int k) {
    std::string digits;
    const size_t dot = n.find('.');
    const std::string whole = n.substr(n[0] == '-', dot == std::string::npos ? std::string::npos : dot - (n[0] == '-'));
    std::string frac = dot == std::string::npos ? "" : n.substr(dot + 1);
    while (!frac.empty() && frac.back() == '0') frac.pop_back();
    if (static_cast<int>(frac.size()) > k) return false;
    digits = whole + frac + std::string(static_cast<size_t>(k) - frac.size(), '0');
    int64_t r = 0;
    for (char c : digits) r = (r * 10 + (c - '0')) % p;
    return r == 0;
  };
  std::vector<std::string> numbers;
  for (const char* whole : {"0", "1", "2", "3", "7", "12", "14", "21", "24", "36", "45", "130", "131", "1000"}) {
    for (const char* frac : {"", "0", "00", "01", "001", "05", "1", "25", "250", "3", "5", "50", "75", "749", "99", "999"}) {
      for (const char* sign : {"", "-"}) numbers.push_back(std::string(sign) + whole + (*frac ? "." : "") + frac);
    }
  }
  for (const Multiple& m : multiples) {
    Json schema = {{"type", "number"}, {"multipleOf", Json::parse(m.m)}};
    if (m.lo) schema["minimum"] = Json::parse(m.lo);
    if (m.hi) schema["maximum"] = Json::parse(m.hi);
    SCOPED_TRACE(schema.dump());
    const auto compiled = CompileSchema(schema);
    ASSERT_NE(compiled, nullptr);
    int within = 0;
    for (const std::string& n : numbers) {
      if (n[0] == '-' && CompareDecimal(n, "0") == 0) continue;  // "-0": neither written nor refused
      const bool in = is_multiple(n, m.p, m.k) && (!m.lo || CompareDecimal(n, m.lo) >= 0) && (!m.hi || CompareDecimal(n, m.hi) <= 0);
      within += in;
      EXPECT_EQ(Accepts(compiled.get(), n), in) << n;
    }
    EXPECT_GT(within, 0);
  }
}

// A format beside a pattern or lengths is read by an automaton from the format's regex: the same
// language as the format's own grammar (compared over valid and invalid texts of each), and then
// only what the pattern and lengths allow too.
TEST(JsonSchema, FormatsWithPatternsOrLengthsKeepTheFormat) {
  const std::map<std::string, std::vector<std::string>> texts = {
      {"date", {"2024-02-28", "2024-02-29", "1999-12-31", "2024-13-01", "2024-04-31", "2024-4-01", "20240101"}},
      {"time", {"12:30:00Z", "23:59:59.123456+05:30", "24:00:00Z", "12:30:00", "12:30:00.1234567Z", "1:30:00Z"}},
      {"date-time", {"2024-01-02T03:04:05Z", "2024-01-02T03:04:05.5-08:00", "2024-01-02 03:04:05Z", "2024-01-02T03:04Z"}},
      {"uuid", {"123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000", "123e4567e89b12d3a456426614174000",
                "123e4567-e89b-12d3-a456-42661417400g"}},
      {"email", {"a@b.co", "first.last+tag@mail.example.org", "a@b", "a..b@c.de", ".a@b.cd", "a@-b.cd", "a@b-.cd", "a b@c.de"}},
      {"hostname", {"example.com", "a", "a-b.c-d", "-a.com", "a_b.com", "a..b"}},
      {"uri", {"https://example.com/a/b", "http://x", "ftp://x.y", "https://x.y/a b", "https://", "https://x.y/~a_b.c-d"}},
      {"ipv4", {"0.0.0.0", "255.255.255.255", "256.1.1.1", "01.2.3.4", "1.2.3", "192.168.1.100"}}};
  for (const auto& [format, samples] : texts) {
    SCOPED_TRACE(format);
    auto plain = ParseGbnf(*JsonSchemaToGbnf(Json{{"type", "string"}, {"format", format}}));
    auto with_lengths = JsonSchemaToGbnf(Json{{"type", "string"}, {"format", format}, {"minLength", 0}});
    ASSERT_TRUE(plain.ok() && with_lengths.ok()) << with_lengths.status().message();
    auto automaton = ParseGbnf(*with_lengths);
    ASSERT_TRUE(automaton.ok()) << automaton.status().message();
    CompiledGrammar a(std::move(*plain), test::ByteTrie()), b(std::move(*automaton), test::ByteTrie());
    int valid = 0;
    for (const std::string& t : samples) {
      const std::string text = Json(t).dump();
      valid += Accepts(&a, text);
      EXPECT_EQ(Accepts(&a, text), Accepts(&b, text)) << t;
    }
    EXPECT_GT(valid, 0);
    EXPECT_LT(valid, static_cast<int>(samples.size()));
  }
  // zod 4's z.email(), z.uuid(), z.iso.datetime(): a format with zod's own pattern beside it; and
  // a format with lengths.
  const std::vector<Case> cases = {
      {R"({"type": "string", "format": "email", "pattern": "^(?:[A-Za-z0-9_'+\\-]+\\.)*[A-Za-z0-9_'+\\-]*[A-Za-z0-9_+-]@(?:[A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})",
       {R"("jane@acme.dev")", R"("a.b+c@mail.example.org")"},
       {R"("jane@acme.d")", R"("jane@acme")", R"("jane@acme.d3v")", R"("o'neil@x.io")", R"("a..b@c.de")"}},
      {R"({"type": "string", "format": "uuid", "pattern": "^([0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[1-8][0-9a-fA-F]{3}-[89abAB][0-9a-fA-F]{3}-[0-9a-fA-F]{12}|00000000-0000-0000-0000-000000000000|ffffffff-ffff-ffff-ffff-ffffffffffff)$"})",
       {R"("123e4567-e89b-42d3-a456-426614174000")", R"("00000000-0000-0000-0000-000000000000")"},
       {R"("123e4567-e89b-02d3-a456-426614174000")", R"("123e4567-e89b-42d3-c456-426614174000")"}},
      {R"({"type": "string", "format": "date-time", "pattern": "^(?:(?:\\d\\d[2468][048]|\\d\\d[13579][26]|\\d\\d0[48]|[02468][048]00|[13579][26]00)-02-29|\\d{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12]\\d|3[01])|(?:0[469]|11)-(?:0[1-9]|[12]\\d|30)|(?:02)-(?:0[1-9]|1\\d|2[0-8])))T(?:(?:[01]\\d|2[0-3]):[0-5]\\d:[0-5]\\d(?:\\.\\d+)?(?:Z))$"})",
       {R"("2024-05-06T07:08:09Z")", R"("2024-05-06T07:08:09.25Z")"},
       {R"("2024-05-06T07:08:09+01:00")", R"("2024-05-06T07:08Z")", R"("2024-02-30T00:00:00Z")"}},
      {R"({"type": "string", "format": "email", "maxLength": 8})", {R"("a@b.co")", R"("ab@cd.ef")"}, {R"("abc@de.fg")", R"("a@b")"}},
      // zod 4.0's (and zod 3.25's zod/v4) email pattern opens with two negative lookaheads.
      {R"({"type": "string", "format": "email", "pattern": "^(?!\\.)(?!.*\\.\\.)([A-Za-z0-9_'+\\-\\.]*)[A-Za-z0-9_+-]@([A-Za-z0-9][A-Za-z0-9\\-]*\\.)+[A-Za-z]{2,}$"})",
       {R"("jane@acme.dev")", R"("a.b@c.io")"}, {R"(".jane@acme.dev")", R"("ja..ne@acme.dev")", R"("jane@acme")"}},
      // Lookaheads at the start of a pattern alone: one that must not match, one that must.
      {R"({"type": "string", "pattern": "^(?!admin$)[a-z]+$"})", {R"("bob")", R"("admins")"}, {R"("admin")", R"("Bob")"}},
      {R"({"type": "string", "pattern": "^(?=.*[0-9])[a-z0-9]{3,}$", "maxLength": 5})", {R"("ab1")", R"("1bcde")"}, {R"("abc")", R"("ab1def")", R"("a1")"}},
      {R"({"type": "string", "format": "int32", "pattern": "^[0-9]+$"})", {R"("42")"}, {R"("x")"}},  // an annotation
  };
  for (const Case& c : cases) {
    auto gbnf = JsonSchemaToGbnf(Json::parse(c.schema));
    ASSERT_TRUE(gbnf.ok()) << c.schema << ": " << gbnf.status().message();
    auto g = ParseGbnf(*gbnf);
    ASSERT_TRUE(g.ok()) << c.schema << ": " << g.status().message();
    CompiledGrammar compiled(std::move(*g), test::ByteTrie());
    for (const char* t : c.good) EXPECT_TRUE(Accepts(&compiled, t)) << c.schema << " should accept " << t;
    for (const char* t : c.bad) EXPECT_FALSE(Accepts(&compiled, t)) << c.schema << " should reject " << t;
  }
}

// Lengths past GBNF's 10,000 per repetition: groups of 100, every length between the bounds.
TEST(JsonSchema, LongLengthsAreCountsOfGroups) {
  auto g = ParseGbnf(*JsonSchemaToGbnf(Json::parse(R"({"type": "string", "minLength": 10150, "maxLength": 30237})")));
  ASSERT_TRUE(g.ok()) << g.status().message();
  CompiledGrammar compiled(std::move(*g), test::ByteTrie());
  for (int len : {10150, 10151, 10199, 10200, 20000, 30199, 30200, 30236, 30237}) {
    EXPECT_TRUE(Accepts(&compiled, "\"" + std::string(len, 'x') + "\"")) << len;
  }
  for (int len : {0, 10149, 30238, 30300}) EXPECT_FALSE(Accepts(&compiled, "\"" + std::string(len, 'x') + "\"")) << len;
  auto items = ParseGbnf(*JsonSchemaToGbnf(Json::parse(R"({"type": "array", "items": {"const": 1}, "maxItems": 100000})")));
  ASSERT_TRUE(items.ok()) << items.status().message();
  CompiledGrammar c2(std::move(*items), test::ByteTrie());
  std::string arr = "[1";
  for (int i = 1; i < 12345; ++i) arr += ",1";
  EXPECT_TRUE(Accepts(&c2, arr + "]"));
  EXPECT_TRUE(Accepts(&c2, "[]"));
}

// Objects nested 28 deep (each "parent-N" named rule beside the parser's own group rules).
TEST(JsonSchema, ObjectsNestedDeepCompile) {
  Json schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}}}}}};
  std::string text = "{\"a\":1}";
  for (int i = 0; i < 28; ++i) {
    schema = {{"type", "object"}, {"properties", {{"a", {{"type", "integer"}, {"minimum", 0}}}, {"child", schema}}}};
    text = "{\"a\":2,\"child\":" + text + "}";
  }
  auto gbnf = JsonSchemaToGbnf(schema);
  ASSERT_TRUE(gbnf.ok()) << gbnf.status().message();
  auto g = ParseGbnf(*gbnf);
  ASSERT_TRUE(g.ok()) << g.status().message();
  CompiledGrammar compiled(std::move(*g), test::ByteTrie());
  EXPECT_TRUE(Accepts(&compiled, text));
  EXPECT_FALSE(Accepts(&compiled, text.substr(0, text.size() - 1)));
}

TEST(JsonSchema, KeywordsAcceptAndRefuseWhatTheyShould) {
  const std::vector<Case> cases = {
      {R"({"type": "string"})", {R"("hi")", R"("a\"b\\c\u00e9\n")", "\"\xC3\xA9\""}, {R"(hi)", "\"a\nb\"", R"("\ud800")", R"("\q")"}},
      {R"({"type": "integer"})", {"0", "-12", "123456789012345"}, {"01", "1.5", "-", "+1", "1e3"}},
      {R"({"type": "number"})", {"0", "-1.25", "3e10", "2.5E-3"}, {".5", "1.", "01", "NaN"}},
      {R"({"type": "boolean"})", {"true", "false"}, {"True", "1"}},
      {R"({"type": "null"})", {"null"}, {"nil", ""}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]})",
       {R"({"a": 1})", R"({"a": 1, "b": "x"})", "{\n  \"a\": 2,\n  \"b\": \"y\"\n}"},
       {R"({})", R"({"b": "x"})", R"({"b": "x", "a": 1})", R"({"a": 1, "c": 2})", R"({"a": 1,})"}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}})",
       {"{}", R"({"b": 1})", R"({"a": 1, "c": 3})", R"({"a": 1, "b": 2, "c": 3})"}, {R"({, "b": 1})", R"({"c": 1, "a": 1})"}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "boolean"}})",
       {R"({"a": 1, "x": true})", R"({"x": false})"}, {R"({"x": 1})", R"({"a": true})", R"({"a": 1, "a": true})"}},
      // oneOf whose branches are disjoint: by type, by a discriminating key both require, by a key
      // one requires that the other does not allow; the siblings' required keys still hold.
      {R"({"oneOf": [{"type": "string"}, {"type": "integer"}]})", {R"("a")", "3"}, {"true"}},
      {R"({"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}}, "required": ["k", "x"]},
                     {"type": "object", "properties": {"k": {"enum": ["b", "c"]}, "y": {"type": "string"}}, "required": ["k"]}]})",
       {R"({"k": "a", "x": 1})", R"({"k": "c", "y": "s"})"}, {R"({"k": "a", "y": "s"})", R"({"x": 1})"}},
      {R"({"type": "object", "oneOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false},
                                       {"properties": {"b": {"type": "integer"}}, "required": ["b"], "additionalProperties": false}]})",
       {R"({"a": 1})", R"({"b": 2})"}, {"{}", R"({"a": 1, "b": 2})"}},
      {R"({"type": "object", "properties": {"n": {"type": "string"}}, "required": ["n"],
           "oneOf": [{"properties": {"k": {"const": "x"}}, "required": ["k"]}, {"properties": {"k": {"const": "y"}}, "required": ["k"]}]})",
       {R"({"n": "s", "k": "x"})", R"({"n": "s", "k": "y"})"}, {R"({"k": "x"})", R"({"n": "s"})", R"({"n": "s", "k": "z"})"}},
      // A pattern of one class repeated, with lengths: both hold.
      {R"({"type": "string", "pattern": "^[a-z0-9_]+$", "minLength": 3, "maxLength": 5})", {R"("abc")", R"("a_9zz")"},
       {R"("ab")", R"("abcdef")", R"("ABC")", R"("")"}},
      {R"({"type": "string", "pattern": "\\d{4,8}", "maxLength": 6})", {R"("1234")", R"("123456")"}, {R"("123")", R"("1234567")", R"("12a4")"}},
      {R"({"type": "string", "pattern": "^.*$", "minLength": 2})", {R"("a\"")", R"("xyz")"}, {R"("a")"}},
      // Patterns match anywhere unless anchored (JSON Schema's ECMAScript search).
      {R"({"type": "string", "pattern": "a+"})", {R"("xxaayy")", R"("a")"}, {R"("xyz")", R"("")"}},
      {R"({"type": "string", "pattern": "^ab|yz$"})", {R"("abc")", R"("xyz")", R"("ab")"}, {R"("cab")", R"("yzx")"}},
      {R"({"type": "string", "pattern": "[0-9]{3}", "minLength": 5, "maxLength": 6})", {R"("ab123")", R"("123456")", R"("1234\n")"},
       {R"("123")", R"("ab12cd")", R"("abc1234")"}},
      // patternProperties: a key takes the schema of every pattern it matches, a declared one its
      // own too; keys matching none take additionalProperties'.
      {R"({"type": "object", "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": false})",
       {R"({"x-a": 1})", "{}", R"({"x-": 2, "x-b": 3})"}, {R"({"x-a": "s"})", R"({"y": 1})", R"({"ax-": 1})"}},
      {R"({"patternProperties": {"^s_": {"type": "string"}, "^i_": {"type": "integer"}}})",
       {R"({"s_a": "x", "i_b": 2, "z": [1]})", R"({"s": 1})"}, {R"({"s_a": 1})", R"({"i_": "x"})"}},
      {R"({"properties": {"a1": {"type": "integer", "minimum": 0}}, "patternProperties": {"[0-9]": {"maximum": 5}},
           "additionalProperties": false})",
       {R"({"a1": 3})", R"({"b2": 4})", R"({"a1": 0, "b2": "s"})"}, {R"({"a1": 7})", R"({"a1": -1})", R"({"b2": 9})", R"({"bb": 1})",
                                                                    R"({"a1": 1, "a1": 9})"}},
      {R"({"patternProperties": {"a": {"type": "integer"}, "b": {"minimum": 3}}, "additionalProperties": false})",
       {R"({"ab": 3})", R"({"a": 1})", R"({"b": "s"})"}, {R"({"ab": 1})", R"({"ab": "x"})", R"({"c": 1})"}},
      {R"({"required": ["x-id"], "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": false})",
       {R"({"x-id": "s"})", R"({"x-id": "s", "x-k": "t"})"}, {"{}", R"({"x-id": 1})"}},
      {R"({"patternProperties": {"^n": {"type": "integer"}}, "additionalProperties": {"type": "string"}})",
       {R"({"n1": 1, "s": "x"})", "{}"}, {R"({"n1": "x"})", R"({"s": 1})"}},
      // 'not' where a grammar can say it: another type, a key absent, a double negation, nothing.
      {R"({"not": {"type": "string"}})", {"1", "1.5", "true", "null", "[]", R"({"a": "s"})"}, {R"("s")"}},
      {R"({"type": ["integer", "string"], "not": {"type": "number"}})", {R"("s")"}, {"1", "null"}},
      {R"({"type": "object", "additionalProperties": true, "not": {"required": ["b"]}})", {R"({"a": 1})", "{}"}, {R"({"b": 1})", "[]"}},
      {R"({"not": {"not": {"type": "integer", "minimum": 3}}})", {"3", "40"}, {"2", R"("a")"}},
      {R"({"type": "object", "properties": {"x": {"not": {}}, "y": {"not": false, "type": "integer"}}, "additionalProperties": true})",
       {"{}", R"({"y": 1})", R"({"z": 1})"}, {R"({"x": 1})", R"({"y": "s"})"}},
      // ... never every key of a set (required keys together, allOf/anyOf of required), through a $ref
      {R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "not": {"required": ["a", "b"]}})",
       {"{}", R"({"a": 1, "c": 2})", R"({"b": 1, "c": 2})"}, {R"({"a": 1, "b": 2})", R"({"a": 1, "b": 2, "c": 3})", "[]", "1"}},
      {R"({"properties": {"a": {}, "b": {}, "c": {}}, "required": ["a"], "$defs": {"r": {"required": ["c"]}},
           "not": {"anyOf": [{"allOf": [{"required": ["b"]}, {"$ref": "#/$defs/r"}]}, {"required": ["a", "c"]}]}})",
       {R"({"a": 1, "b": 2})", R"({"a": 1})"}, {R"({"a": 1, "c": 2})", R"({"a": 1, "b": 2, "c": 3})", "{}"}},
      // ... a string but these (non-strings pass; null excluded too), a string matching no pattern
      {R"({"not": {"enum": ["a", "b\"", null]}})", {R"("c")", R"("ab")", R"("")", "1", "true", "[]"}, {R"("a")", R"("b"")", "null"}},
      {R"({"type": "string", "maxLength": 3, "not": {"const": "ab"}})", {R"("a")", R"("abc")"}, {R"("ab")", R"("abcd")", "1"}},
      {R"({"type": ["string", "integer"], "not": {"type": "string", "pattern": "^x"}})", {R"("ax")", "7"}, {R"("x")", R"("xy")"}},
      {R"({"not": {"pattern": "[0-9]"}})", {R"("abc")", R"("")"}, {R"("a1")", "1", "null"}},
      {R"({"type": "string", "format": "email", "not": {"enum": ["a@b.co"]}})", {R"("c@b.co")"}, {R"("a@b.co")", R"("nope")"}},
      {R"({"type": "object", "properties": {"id": {"type": "string"}}, "patternProperties": {".*": true}})",
       {R"({"id": "a", "other": [1]})"}, {R"({"id": 1})"}},
      // enum and const values the schema's other keywords refuse match nothing.
      {R"({"enum": ["a", "bb", 3, 30], "minLength": 2, "maximum": 10})", {R"("bb")", "3"}, {R"("a")", "30"}},
      {R"({"type": "object", "properties": {"k": {"const": "a", "pattern": "b"}}})", {"{}"}, {R"({"k": "a"})"}},
      // uniqueItems over a few values: each at most once, in any order, within the counts.
      {R"({"type": "array", "uniqueItems": true, "items": {"enum": ["r", "g", "b", 1, 1.0]}})",
       {"[]", R"(["g"])", R"(["b", "r", 1])", R"(["r", "g", "b", 1])"}, {R"(["r", "r"])", R"(["g", 1, "g"])", "[1, 1.0]", R"(["x"])"}},
      {R"({"type": "array", "uniqueItems": true, "minItems": 2, "items": {"type": "boolean"}})",
       {"[true, false]", "[false, true]"}, {"[true]", "[true, true]", "[]"}},
      {R"({"type": "array", "uniqueItems": true, "maxItems": 1, "items": {"$ref": "#/$defs/c"}, "$defs": {"c": {"enum": ["a", "b"]}}})",
       {"[]", R"(["b"])"}, {R"(["a", "b"])"}},
      {R"({"enum": [{"a": 1}, {"a": "x"}, {"b": 2}, [1, 1], [1, 2], [3]], "properties": {"a": {"type": "integer"}},
           "required": ["a"], "uniqueItems": true, "items": {"maximum": 2}})",
       {R"({"a": 1})", "[1, 2]"}, {R"({"a": "x"})", R"({"b": 2})", "[1, 1]", "[3]"}},
      // enum and const values of another type than the schema's match nothing.
      {R"({"enum": ["a", 1, 2.0, null], "type": ["integer", "null"]})", {"1", "2.0", "null"}, {R"("a")"}},
      {R"({"type": "object", "properties": {"b": {"enum": ["X"], "type": "object"}, "c": {"type": "integer"}}})", {R"({"c": 1})", "{}"},
       {R"({"b": "X"})"}},
      // A required property not in 'properties': present, with what additional keys take.
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": {"type": "boolean"}})",
       {R"({"a": 1, "b": true})", R"({"a": 1, "b": false, "c": true})"}, {R"({"a": 1})", R"({"a": 1, "b": 1})", R"({"b": true})"}},
      {R"({"type": "object", "required": ["id"]})", {R"({"id": 1})", R"({"id": "x", "k": [2]})"}, {"{}", R"({"k": 1})", R"({"id": 1, "id": 2})"}},
      // A declared property cannot come again through additionalProperties, however it is spelled.
      {R"({"type": "object", "properties": {"a": {"type": "integer"}, "ab": {"type": "integer"}, "\u00e9": {"type": "integer"},
           "q\"": {"type": "integer"}, "t\n": {"type": "integer"}}, "additionalProperties": true})",
       {R"({"a": 1, "abc": "x"})", R"({"b": 2})", R"({"": 1})", R"({"a": 1, "ab": 2, "aa": 3})", R"({"\n": 1})",
        "{\"\xC3\xA9\xC3\xA9\": 1}", R"({"q": 1})", R"({"q\"r": 1})", R"({"t\t": 1})", R"({"x": 1, "y": 2})"},
       {R"({"a": "x"})", R"({"a": 1, "a": 2})", R"({"ab": "x"})", "{\"\xC3\xA9\": \"x\"}", R"({"q\"": "x"})",
        R"({"\u0061": "x"})", R"({"t\n": "x"})", R"({"x": 1, "ab": "y"})"}},
      {R"({"type": "object"})", {"{}", R"({"k": [1, {"z": null}]})"}, {"[]"}},
      {R"({"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3})",
       {"[1]", "[1, 2, 3]"}, {"[]", "[1, 2, 3, 4]", R"(["a"])"}},
      {R"({"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}]})", {R"(["a", 1])"}, {R"(["a"])", R"([1, "a"])"}},
      {R"({"enum": ["red", "green", 3, null]})", {R"("red")", "3", "null"}, {R"("blue")", "4"}},
      {R"({"const": {"k": [1, "two"]}})", {R"({"k":[1,"two"]})"}, {R"({"k": [1, "two"]})"}},
      {R"({"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]})", {"7", R"("ab")"}, {R"("abc")", "true"}},
      {R"({"type": ["string", "null"]})", {R"("x")", "null"}, {"1"}},
      {R"({"type": "string", "minLength": 2, "maxLength": 3})", {R"("ab")", R"("a\"c")"}, {R"("a")", R"("abcd")"}},
      {R"({"type": "string", "pattern": "^[A-Z]{2}-\\d+$"})", {R"("AB-12")"}, {R"("ab-12")", R"("AB-")"}},
      {R"({"type": "string", "format": "date"})", {R"("2024-02-28")", R"("1999-12-31")"}, {R"("2024-02-30")", R"("2024-13-01")", R"("2024-04-31")"}},
      // date-time in UTC ("Z") and email with a top-level domain of letters: what JSON Schema allows
      // and zod's own checks (z.string().datetime(), .email()) accept too.
      {R"({"type": "string", "format": "date-time"})", {R"("2024-01-05T10:20:30Z")", R"("2024-01-05T10:20:30.5Z")"},
       {R"("2024-01-05 10:20:30")", R"("2024-01-05T10:20:30")", R"("2024-01-05T10:20:30.5+02:00")"}},
      {R"({"type": "string", "format": "email"})", {R"("ada.l+x@math.example.org")"},
       {R"("ada@localhost")", R"("a@-x.org")", R"("@x.org")", R"("a@b.c")", R"("a@b.c2")"}},
      {R"({"type": "string", "format": "uri"})", {R"("https://example.com/a/b.html")", R"("http://x.io")"}, {R"("example.com")"}},
      {R"({"type": "string", "format": "ipv4"})", {R"("192.168.0.255")"}, {R"("256.1.1.1")", R"("1.2.3")"}},
      {R"({"type": "string", "format": "uuid"})", {R"("123e4567-e89b-12d3-a456-426614174000")"}, {R"("123e4567")"}},
      {R"({"type": "string", "format": "ipv6"})", {R"("::1")", R"("2001:db8::8a2e:370:7334")", R"("::ffff:192.0.2.1")", R"("1:2:3:4:5:6:7:8")", R"("::")"},
       {R"("1:2:3:4:5:6:7:8:9")", R"("2001:db8:::1")", R"("12345::")", R"("1::2::3")", R"("g::1")"}},
      {R"({"type": "string", "format": "duration"})", {R"("P3Y6M4DT12H30M5S")", R"("PT20M")", R"("P2W")", R"("P1D")", R"("P1M2D")"},
       {R"("P")", R"("PT")", R"("3Y")", R"("P1S")", R"("P1Y2W")"}},
      {R"({"type": "string", "format": "uri-reference"})", {R"("/a/b?c=d#e")", R"("../x")", R"("mailto:ada@example.org")", R"("")", R"("a%20b")"},
       {R"("://")", R"("a b")", R"(":x")", R"("%zz")"}},
      {R"({"type": "string", "format": "iri"})", {R"("https://example.org/résumé")", "\"urn:isbn:0451450523\"", "\"http://\xC3\xA9x.org/\""},
       {R"("not-an-iri")", R"("//x.org")"}},
      {R"({"type": "string", "format": "uri-template"})", {R"("http://example.com/{id}/items{?page,per_page}")", R"("/static")", R"("{+path:3}/x{#frag*}")"},
       {R"("http://example.com/resource/{")", R"("{}")", R"("a b")", R"("{a b}")"}},
      // allOf: a property two parts constrain satisfies both; a closed part allows only its own keys.
      {R"({"allOf": [{"properties": {"n": {"type": "integer", "minimum": 1}}}, {"properties": {"n": {"type": "integer", "maximum": 9}}}], "required": ["n"]})",
       {R"({"n": 1})", R"({"n": 9})"}, {R"({"n": 0})", R"({"n": 10})"}},
      {R"({"allOf": [{"properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}], "properties": {"a": {}}, "additionalProperties": false})",
       {R"({"a": 1})", "{}"}, {R"({"a": 1, "b": 2})", R"({"b": 2})"}},
      // A discriminator the siblings declare and each oneOf branch narrows to a const.
      {R"({"type": "object", "properties": {"kind": {"type": "string"}, "v": {}}, "required": ["kind"],
           "oneOf": [{"properties": {"kind": {"const": "a"}, "v": {"type": "integer"}}}, {"properties": {"kind": {"const": "b"}, "v": {"type": "string"}}}]})",
       {R"({"kind": "a", "v": 1})", R"({"kind": "b", "v": "x"})", R"({"kind": "a"})"}, {R"({"kind": "a", "v": "x"})", R"({"kind": "c"})", R"({"v": 1})"}},
      // A branch closed by additionalProperties false keeps only its own keys; one that can match
      // nothing with the siblings drops out.
      {R"({"properties": {"x": {"type": "integer"}}, "required": ["x"],
           "anyOf": [{"properties": {"y": {"type": "integer"}}, "additionalProperties": false}, {"properties": {"x": {}, "z": {"type": "boolean"}}, "additionalProperties": false}]})",
       {R"({"x": 1, "z": true})", R"({"x": 1})"}, {R"({"x": 1, "y": 2})", R"({"y": 2})"}},
      // Items no value satisfies: only the empty array.
      {R"({"type": "array", "items": {"allOf": [{"properties": {"w": {"type": "number"}}, "required": ["w"], "additionalProperties": false}],
           "properties": {"id": {"type": "string"}}, "required": ["id"], "additionalProperties": false}})",
       {"[]"}, {R"([{"id": "x"}])", R"([{"w": 1}])", R"([{"id": "x", "w": 1}])"}},
      {R"({"type": "integer", "minimum": 10, "maximum": 250})", {"10", "99", "100", "250"}, {"9", "251", "300", "-10", "1000"}},
      {R"({"type": "integer", "minimum": -5, "exclusiveMaximum": 3})", {"-5", "-1", "0", "2"}, {"-6", "3", "-0"}},
      {R"({"type": "integer", "exclusiveMinimum": 0})", {"1", "12345678"}, {"0", "-1"}},
      {R"({"type": "integer", "maximum": -10})", {"-10", "-99999"}, {"-9", "0", "5"}},
      {R"({"type": "number", "minimum": 0, "maximum": 1})", {"0", "0.25", "1", "1.000"}, {"1.5", "-0.1", "2"}},
      // multipleOf: 10^-k as digits after the point (with bounds), others by remainder (without).
      {R"({"type": "number", "minimum": 0, "multipleOf": 0.01})", {"0", "19.99", "0.5", "3", "1.10", "100.000"}, {"0.001", "-1", "19.999"}},
      {R"({"type": "integer", "multipleOf": 5})", {"0", "5", "-15", "1000"}, {"3", "12", "5.5"}},
      {R"({"type": "number", "multipleOf": 2.5})", {"0", "2.5", "5", "-7.5", "10.0", "12.50"}, {"1", "2.4", "3.75"}},
      {R"({"type": "number", "multipleOf": 1})", {"3", "3.0", "-2"}, {"3.5", "0.1"}},
      // minProperties / maxProperties: the members written are counted, extra keys too.
      {R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "minProperties": 2})",
       {R"({"a": 1, "b": 2})", R"({"a": 1, "c": 3})", R"({"a": 1, "b": 2, "c": 3})"}, {"{}", R"({"a": 1})", R"({"c": 1})"}},
      {R"({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"], "maxProperties": 1})", {R"({"a": 1})"},
       {R"({"a": 1, "b": 2})", R"({"b": 2})", "{}"}},
      {R"({"type": "object", "minProperties": 1, "additionalProperties": {"type": "integer"}})", {R"({"x": 1})", R"({"x": 1, "y": 2, "z": 3})"},
       {"{}", R"({"x": "s"})"}},
      {R"({"type": "object", "maxProperties": 2})", {"{}", R"({"a": 1, "b": []})"}, {R"({"a": 1, "b": 2, "c": 3})"}},
      {R"({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": true, "minProperties": 2, "maxProperties": 3})",
       {R"({"a": 1, "x": 2})", R"({"x": 1, "y": 2, "z": 3})"}, {R"({"a": 1})", R"({"a": 1, "x": 1, "y": 2, "z": 3})", R"({"a": "s", "x": 1})"}},
      // A union's $ref branch takes the keywords beside the union too (recursively, too).
      {R"({"maxLength": 3, "anyOf": [{"$ref": "#/$defs/s"}, {"type": "integer"}], "$defs": {"s": {"type": "string"}}})",
       {R"("abc")", "7"}, {R"("abcd")"}},
      {R"({"type": "object", "additionalProperties": {"minProperties": 1, "anyOf": [{"type": "string"}, {"$ref": "#/definitions/r"}]},
           "definitions": {"r": {"type": "object", "additionalProperties": {"minProperties": 1, "anyOf": [{"type": "string"}, {"$ref": "#/definitions/r"}]}}}})",
       {R"({"a": "x", "b": {"c": "y", "d": {"e": "z"}}})"}, {R"({"a": {}})", R"({"a": {"b": {}}})"}},
      // allOf inside allOf: its parts join; a union inside a part becomes the merged schema's own.
      {R"({"allOf": [{"allOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}]}, {"properties": {"b": {"type": "string"}}}]})",
       {R"({"a": 1, "b": "x"})", R"({"a": 1})"}, {R"({"b": "x"})", R"({"a": "1"})"}},
      {R"({"allOf": [{"type": "object", "properties": {"kind": {"type": "string"}, "v": {}}, "required": ["kind"]},
                     {"oneOf": [{"properties": {"kind": {"const": "a"}, "v": {"type": "integer"}}}, {"properties": {"kind": {"const": "b"}, "v": {"type": "string"}}}]}]})",
       {R"({"kind": "a", "v": 1})", R"({"kind": "b", "v": "x"})"}, {R"({"kind": "a", "v": "x"})", R"({"kind": "c"})"}},
      // dependentRequired / dependencies (lists): a member present makes others required, before
      // or after it in the order written; one needing a key no object has is never present.
      {R"({"type": "object", "properties": {"card": {"type": "string"}, "billing": {"type": "string"}, "name": {}}, "dependentRequired": {"card": ["billing"]}})",
       {R"({"name": 1})", R"({"card": "x", "billing": "y"})", R"({"billing": "y"})"}, {R"({"card": "x"})", R"({"card": "x", "name": 1})"}},
      {R"({"type": "object", "properties": {"billing": {}, "card": {}}, "dependencies": {"card": ["billing"]}})",
       {R"({"billing": 1, "card": 2})", R"({"billing": 1})", "{}"}, {R"({"card": 2})"}},
      {R"({"type": "object", "properties": {"a": {}, "b": {}}, "additionalProperties": false, "dependencies": {"a": ["zzz"]}})",
       {"{}", R"({"b": 1})"}, {R"({"a": 1})"}},
      {R"({"type": "object", "properties": {"a": {}, "b": {}, "c": {}}, "dependentRequired": {"a": ["c"], "c": ["b"]}, "minProperties": 1})",
       {R"({"a": 1, "b": 2, "c": 3})", R"({"b": 2})", R"({"b": 2, "c": 3})"}, {"{}", R"({"a": 1, "c": 3})", R"({"c": 3})"}},
      // contains: at least one item matches it too.
      {R"({"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}})", {"[10]", "[1, 2, 30]", "[11, 1]"},
       {"[]", "[1, 2]", R"(["x", 10])"}},
      {R"({"contains": {"const": "admin"}})", {R"(["admin"])", R"([1, "admin", null])"}, {"[]", R"(["user"])"}},
      // Other multiples within two bounds: each one written.
      {R"({"type": "integer", "minimum": 16, "maximum": 100, "multipleOf": 4})", {"16", "20", "100"}, {"12", "18", "104", "16.0"}},
      {R"({"type": "number", "exclusiveMinimum": -5, "maximum": 5, "multipleOf": 2.5})", {"-2.5", "0", "5", "2.50", "5.0"}, {"-5", "1", "7.5"}},
      // propertyNames: every key, declared or not, is a string it allows.
      {R"({"type": "object", "propertyNames": {"pattern": "^[a-z]+$"}, "additionalProperties": {"type": "integer"}})",
       {R"({"abc": 1})", "{}", R"({"a": 1, "b": 2})"}, {R"({"Abc": 1})", R"({"a1": 2})", R"({"a": "x"})"}},
      {R"({"type": "object", "properties": {"id": {}, "long": {}}, "propertyNames": {"maxLength": 3}})", {R"({"id": 1})", "{}"},
       {R"({"long": 1})"}},
      {R"({"type": "object", "propertyNames": {"$ref": "#/$defs/ab"}, "$defs": {"ab": {"enum": ["a", "b"]}}})", {R"({"a": 1, "b": 2})", "{}"},
       {R"({"c": 1})"}},
      {R"({"type": "object", "properties": {"name": {"type": "string"}}, "additionalProperties": true, "propertyNames": {"format": "email"}})",
       {R"({"a@b.co": 1})", "{}"}, {R"({"name": "x"})", R"({"x": 1})"}},
      // Number keywords without a type constrain numbers only.
      {R"({"multipleOf": 3})", {"9", "-12", R"("x")", "null"}, {"10", "4"}},
      {R"({"minimum": 5})", {"5", "7.5", R"("s")", "[1]"}, {"4", "-1"}},
      {R"({"$defs": {"node": {"type": "object", "properties": {"v": {"type": "integer"}, "next": {"anyOf": [{"$ref": "#/$defs/node"}, {"type": "null"}]}}, "required": ["v", "next"]}}, "$ref": "#/$defs/node"})",
       {R"({"v": 1, "next": {"v": 2, "next": null}})"}, {R"({"v": 1, "next": {"v": 2}})"}},
      {R"({"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"b": {"type": "string"}}}]})",
       {R"({"a": 1, "b": "x"})", R"({"a": 1})"}, {R"({"b": "x"})"}},
      {R"({"type": "object", "properties": {"q": {"type": "string", "nullable": true}}, "required": ["q"], "additionalProperties": false})",
       {R"({"q": null})", R"({"q": "s"})"}, {R"({"q": 1})"}},
      {R"(true)", {"1", R"({"a": [true]})"}, {"tru"}},
  };
  for (const Case& c : cases) {
    auto gbnf = JsonSchemaToGbnf(Json::parse(c.schema));
    ASSERT_TRUE(gbnf.ok()) << c.schema << ": " << gbnf.status().message();
    auto g = ParseGbnf(*gbnf);
    ASSERT_TRUE(g.ok()) << c.schema << ": " << g.status().message() << "\n" << *gbnf;
    CompiledGrammar compiled(std::move(*g), test::ByteTrie());
    for (const char* s : c.good) {
      EXPECT_TRUE(Accepts(&compiled, Compact(s))) << c.schema << " should accept " << Compact(s) << "\n" << *gbnf;
      // Whitespace between tokens is not the format's: refused (one space before the value aside).
      if (Compact(s) != s && std::string(s).find('\n') != std::string::npos) {
        EXPECT_FALSE(Accepts(&compiled, s)) << c.schema << " should refuse the spaced " << s;
      }
      EXPECT_TRUE(Accepts(&compiled, " " + Compact(s))) << c.schema << " should accept a leading space";
    }
    for (const char* s : c.bad) EXPECT_FALSE(Accepts(&compiled, s)) << c.schema << " should refuse " << s << "\n" << *gbnf;
  }
}

TEST(JsonSchema, JsonObjectAndValueGrammars) {
  auto obj = ParseGbnf(JsonObjectGbnf());
  ASSERT_TRUE(obj.ok()) << obj.status().message();
  CompiledGrammar c(std::move(*obj), test::ByteTrie());
  EXPECT_TRUE(Accepts(&c, R"({"a":[1,2.5e3,"x",null,true,{}]})"));
  EXPECT_FALSE(Accepts(&c, R"({"a": [1, 2.5e3]})"));  // compact: no whitespace between tokens
  EXPECT_FALSE(Accepts(&c, "[1]"));
  EXPECT_FALSE(Accepts(&c, R"({"a": 1)"));
  auto val = ParseGbnf(JsonValueGbnf());
  ASSERT_TRUE(val.ok());
  CompiledGrammar v(std::move(*val), test::ByteTrie());
  EXPECT_TRUE(Accepts(&v, "[1]"));
  EXPECT_TRUE(Accepts(&v, "\"s\""));
}

TEST(JsonSchema, RefusalsNameThePath) {
  auto err = [](const char* schema) {
    auto r = JsonSchemaToGbnf(Json::parse(schema));
    return r.ok() ? std::string("ok") : r.status().message();
  };
  EXPECT_NE(err(R"({"properties": {"a": {"type": "array", "uniqueItems": true}}})").find("'/properties/a': 'uniqueItems' is supported only over"), std::string::npos);
  // Formats JSON Schema defines and gale has no grammar for are refused; others are annotations.
  EXPECT_NE(err(R"({"properties": {"r": {"type": "string", "format": "regex"}}})").find("'/properties/r': 'format' 'regex' is not supported"), std::string::npos);
  EXPECT_EQ(err(R"({"type": "string", "format": "int32"})"), "ok");
  EXPECT_NE(err(R"({"type": "number", "multipleOf": 2, "minimum": 1})").find("only one bound"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": 3, "minimum": 0, "maximum": 100000})").find("more than 1,000 values"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": 7, "minimum": 1, "maximum": 6})").find("no value matches"), std::string::npos);
  EXPECT_NE(err(R"({"type": "number", "multipleOf": 0})").find("'multipleOf' must be a number above 0"), std::string::npos);
  EXPECT_NE(err(R"({"type": "number", "multipleOf": 1e-9})").find("finer than"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "multipleOf": 1234567})").find("grammar states"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "#/$defs/missing"})").find("points at nothing"), std::string::npos);
  EXPECT_NE(err(R"({"$ref": "http://example.com/s.json"})").find("only local $refs"), std::string::npos);
  EXPECT_NE(err(R"({"type": "wat"})").find("unknown type 'wat'"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "properties": {}, "required": ["x"]})").find("'x' is not in 'properties'"), std::string::npos);
  EXPECT_NE(err(R"x({"type": "string", "pattern": "(?=x)"})x").find("lookarounds"), std::string::npos);
  EXPECT_NE(err(R"({"type": "integer", "minimum": 5, "maximum": 4})").find("no integer"), std::string::npos);
  EXPECT_NE(err(R"({"type": "number", "minimum": 0.5, "exclusiveMaximum": 0.5})").find("no number"), std::string::npos);
  EXPECT_NE(err(R"({"type": "number", "minimum": 1e-30})").find("cannot be written"), std::string::npos);
  EXPECT_NE(err(R"({"type": "number", "minimum": 1e20})").find("cannot be written"), std::string::npos);
  EXPECT_NE(err(R"({"type": "array", "items": {"type": "string"}, "maxItems": 9999999999})").find("'maxItems' above"), std::string::npos);
  EXPECT_NE(err("false").find("no value matches"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "required": ["Zed"], "propertyNames": {"pattern": "^[a-z]+$"}})").find("no value matches"),
            std::string::npos);
  EXPECT_NE(err(R"({"type": "array", "uniqueItems": true, "items": {"type": "string"}})").find("'uniqueItems' is supported only over"),
            std::string::npos);
  EXPECT_NE(err(R"({"not": {"enum": [1, 2]}})").find("'not' of an 'enum' or 'const' holding values other than strings"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "additionalProperties": true, "not": {"required": ["a", "b"]}})").find("where other keys may come"),
            std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "propertyNames": {"type": "string", "not": {"const": "x"}}})").find("'not' in 'propertyNames'"),
            std::string::npos);
  // A lookahead over only the first of the top-level alternatives: not taken apart, refused.
  EXPECT_NE(err(R"({"type": "string", "pattern": "^(?!a)b|c"})").find("lookaround"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "properties": {"a": {}}, "dependencies": {"a": {"required": ["b"]}}})").find("with a schema"),
            std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "additionalProperties": true, "dependencies": {"x": ["y"]}})").find("does not declare"),
            std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "minProperties": 3, "maxProperties": 2})").find("no value matches"), std::string::npos);
  EXPECT_NE(err(R"({"type": "object", "properties": {"a": {}}, "minProperties": 2})").find("no value matches"), std::string::npos);
  // oneOf branches a value could match both of: refused (anyOf would take them).
  EXPECT_NE(err(R"({"type": "object", "oneOf": [{"required": ["a"]}, {"required": ["b"]}]})").find("'oneOf' branches 0 and 1 may both match"),
            std::string::npos);
  EXPECT_NE(err(R"({"oneOf": [{"type": "integer"}, {"type": "number"}]})").find("may both match"), std::string::npos);
  EXPECT_NE(err("3").find("must be an object or a boolean"), std::string::npos);
}

}  // namespace
}  // namespace gale::grammar
