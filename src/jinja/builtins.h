// Jinja's built-in filters and tests and the Python methods of str, list and dict that chat
// templates call (`content.strip()`, `message.get('x')`, `ns.items.append(y)`), with Python's
// semantics: strings are indexed, sliced and measured in code points.
#pragma once

#include <string>

#include "base/status.h"
#include "jinja/value.h"

namespace gale::jinja {

bool HasFilter(const std::string& name);
bool HasTest(const std::string& name);

StatusOr<Value> ApplyFilter(const std::string& name, const Value& v, CallArgs& args);
StatusOr<bool> ApplyTest(const std::string& name, const Value& v, CallArgs& args);

// obj.name as Jinja resolves it for the `.` operator: a method bound to obj, an entry of a dict,
// or Undefined.
Value GetAttribute(const Value& obj, const std::string& name);
// obj[key] (key first for dicts; index for lists and strings, negative from the end).
StatusOr<Value> GetItem(const Value& obj, const Value& key);
// obj[start:stop:step] with Python's rules (null parts are Undefined).
StatusOr<Value> Slice(const Value& obj, const Value& start, const Value& stop, const Value& step);

// Python string helpers shared with the renderer.
std::u32string ToU32(const std::string& s);
std::string FromU32(const std::u32string& s);
int64_t LengthOf(const Value& v);  // len(); -1 for values without one
// Python iteration: list items, dict keys, string characters; Undefined gives nothing.
StatusOr<ValueList> Iterate(const Value& v);
// Python `%` string formatting: "%s and %d" % (a, b).
// markupsafe.escape's text: & < > " ' as &amp; &lt; &gt; &#34; &#39;.
std::string HtmlEscape(const std::string& s);

StatusOr<std::string> PercentFormat(const std::string& fmt, const Value& args);

}  // namespace gale::jinja
