// A JSON tree for the capacity planner (Hugging Face config.json files, the planner's shared
// test vectors). Parsing is nlohmann::json's (Debian's nlohmann-json3-dev, header-only) through
// its SAX interface; this class only holds the result.
//
// Grammar: RFC 8259 (objects, arrays, strings with escapes including \uXXXX, numbers, true,
// false, null). Numbers are held as double, so integers are exact up to 2^53 (config fields and
// parameter counts are far below that). Object members keep their file order; a repeated key
// resolves to its first occurrence in Find().
//
// Errors: ParseJson returns INVALID_ARGUMENT naming the byte offset of the first problem, or
// saying that the input nests deeper than 64 levels.
#ifndef OFFLOADD_CLIENT_PLAN_JSON_VALUE_H_
#define OFFLOADD_CLIENT_PLAN_JSON_VALUE_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offloadd::plan {

class JsonValue {
 public:
  enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

  JsonValue() = default;
  static JsonValue Null() { return JsonValue(); }
  static JsonValue Bool(bool b);
  static JsonValue Number(double d);
  static JsonValue String(std::string s);
  static JsonValue Array(std::vector<JsonValue> items);
  static JsonValue Object(std::vector<std::pair<std::string, JsonValue>> members);

  Type type() const { return type_; }
  bool is_null() const { return type_ == Type::kNull; }
  bool is_number() const { return type_ == Type::kNumber; }
  bool is_string() const { return type_ == Type::kString; }
  bool is_object() const { return type_ == Type::kObject; }
  bool is_array() const { return type_ == Type::kArray; }

  // Accessors return the stored value; calling one on the wrong type returns the zero value.
  bool bool_value() const { return bool_; }
  double number() const { return number_; }
  const std::string& string_value() const { return string_; }
  const std::vector<JsonValue>& items() const { return items_; }
  const std::vector<std::pair<std::string, JsonValue>>& members() const { return members_; }

  // The member named `key` of an object, or nullptr if absent or this is not an object.
  const JsonValue* Find(absl::string_view key) const;

 private:
  Type type_ = Type::kNull;
  bool bool_ = false;
  double number_ = 0.0;
  std::string string_;
  std::vector<JsonValue> items_;
  std::vector<std::pair<std::string, JsonValue>> members_;
};

// Parses one JSON document (surrounding whitespace allowed, nothing else after it).
absl::StatusOr<JsonValue> ParseJson(absl::string_view text);

}  // namespace offloadd::plan

#endif  // OFFLOADD_CLIENT_PLAN_JSON_VALUE_H_
