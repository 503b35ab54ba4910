// JSON Schema to GBNF: the subset tools and structured outputs use. Every string the grammar
// accepts is valid JSON that validates against the schema; where a keyword cannot be expressed
// exactly the schema is refused with its path, never silently loosened. Supported:
//   type (one or a list), properties / required / additionalProperties (false unless given when
//   there are properties, as OpenAI's strict mode requires, or JSON Schema's open default with
//   ObjectKeys::kOpen; true or a schema allow more keys), patternProperties (a key takes the schema
//   of every pattern it matches), enum, const, anyOf, oneOf (branches shown disjoint), allOf of
//   objects, $ref to #, #/$defs/... and #/definitions/... (recursive schemas too), items,
//   prefixItems, minItems / maxItems, minLength / maxLength, pattern (regex.h, matching anywhere
//   unless anchored, as JSON Schema's ECMAScript patterns do; with lengths through an automaton),
//   format date, time, date-time, uuid, email, hostname, uri, ipv4, ipv6, uri-reference, iri,
//   uri-template, duration (subsets of what those allow; other formats are plain strings), integer
//   minimum / maximum / exclusiveMinimum / exclusiveMaximum, number minimum / maximum with integer
//   bounds >= 0, nullable, not (of true, false, {}, not X, a type, one required key).
// Refused: uniqueItems, multipleOf, other forms of not, if/then/else, dependent*, propertyNames,
// minProperties / maxProperties, and any other bound on numbers.
// Properties are written in the schema's order. The JSON is compact: no whitespace between
// tokens, one optional space before the value.
#pragma once

#include <string>
#include <string_view>

#include <chrono>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "base/thread_clock.h"

namespace gale::grammar {

// The grammar's start rule is root_name. Errors name the schema path ("/properties/a/items").
// A $ref to #/$defs/NAME becomes a rule named NAME (sanitized, and made unique), so a caller can
// build on the rules of the definitions it put there. Past the deadline: DeadlineExceeded (a
// schema of tens of thousands of parts takes a while to convert).
// How an object schema with properties and no additionalProperties is read: kClosed (the default:
// only its declared keys, as OpenAI's strict mode, llama.cpp and XGrammar's strict mode read it),
// kOpen (JSON Schema's own rule: other keys too, with any value).
enum class ObjectKeys { kClosed, kOpen };

StatusOr<std::string> JsonSchemaToGbnf(
    const nlohmann::ordered_json& schema, const std::string& root_name = "root",
    ThreadCpuClock::time_point deadline = ThreadCpuClock::time_point::max(), ObjectKeys objects = ObjectKeys::kClosed);

// JSON text without the whitespace outside strings: the compact form the grammars write (for
// checking a document written with spaces against one).
std::string CompactJsonText(std::string_view text);

// Any JSON object (response_format json_object) and any JSON value.
std::string JsonObjectGbnf();
std::string JsonValueGbnf();

}  // namespace gale::grammar
