#include "client/plan/json_value.h"

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace offloadd::plan {

JsonValue JsonValue::Bool(bool b) {
  JsonValue v;
  v.type_ = Type::kBool;
  v.bool_ = b;
  return v;
}

JsonValue JsonValue::Number(double d) {
  JsonValue v;
  v.type_ = Type::kNumber;
  v.number_ = d;
  return v;
}

JsonValue JsonValue::String(std::string s) {
  JsonValue v;
  v.type_ = Type::kString;
  v.string_ = std::move(s);
  return v;
}

JsonValue JsonValue::Array(std::vector<JsonValue> items) {
  JsonValue v;
  v.type_ = Type::kArray;
  v.items_ = std::move(items);
  return v;
}

JsonValue JsonValue::Object(std::vector<std::pair<std::string, JsonValue>> members) {
  JsonValue v;
  v.type_ = Type::kObject;
  v.members_ = std::move(members);
  return v;
}

const JsonValue* JsonValue::Find(absl::string_view key) const {
  if (type_ != Type::kObject) return nullptr;
  for (const auto& [name, value] : members_) {
    if (name == key) return &value;
  }
  return nullptr;
}

namespace {

// Nesting deeper than this is refused (config.json files nest 2-3 levels).
constexpr int kMaxDepth = 64;

// nlohmann::json's SAX events -> a JsonValue tree: the library does the RFC 8259 parsing
// (strict: nothing may follow the value), this keeps member order and repeated keys as they are.
class Builder : public nlohmann::json_sax<nlohmann::json> {
 public:
  bool null() override { return Add(JsonValue::Null()); }
  bool boolean(bool b) override { return Add(JsonValue::Bool(b)); }
  bool number_integer(number_integer_t n) override {
    return Add(JsonValue::Number(static_cast<double>(n)));
  }
  bool number_unsigned(number_unsigned_t n) override {
    return Add(JsonValue::Number(static_cast<double>(n)));
  }
  bool number_float(number_float_t d, const string_t&) override {
    return Add(JsonValue::Number(d));
  }
  bool string(string_t& s) override { return Add(JsonValue::String(std::move(s))); }
  bool binary(binary_t&) override { return false; }  // not produced by the JSON text parser
  bool start_object(std::size_t) override { return Open(true); }
  bool key(string_t& k) override {
    frames_.back().key = std::move(k);
    return true;
  }
  bool end_object() override { return Close(); }
  bool start_array(std::size_t) override { return Open(false); }
  bool end_array() override { return Close(); }
  bool parse_error(std::size_t position, const std::string&,
                   const nlohmann::detail::exception& e) override {
    // position counts the characters read, the offending one included.
    error_ = absl::InvalidArgumentError(absl::StrCat(
        "invalid JSON at byte ", position > 0 ? position - 1 : 0, ": ", e.what()));
    return false;
  }

  absl::StatusOr<JsonValue> Result(bool parsed) {
    if (!error_.ok()) return error_;
    if (!parsed) {
      return absl::InvalidArgumentError(
          absl::StrCat("invalid JSON: nesting deeper than ", kMaxDepth, " levels"));
    }
    return std::move(root_);
  }

 private:
  struct Frame {
    bool object;
    std::string key;  // objects: the name of the member being read
    std::vector<JsonValue> items;
    std::vector<std::pair<std::string, JsonValue>> members;
  };

  bool Add(JsonValue v) {
    if (frames_.empty()) {
      root_ = std::move(v);
    } else if (frames_.back().object) {
      frames_.back().members.emplace_back(std::move(frames_.back().key), std::move(v));
    } else {
      frames_.back().items.push_back(std::move(v));
    }
    return true;
  }
  bool Open(bool object) {
    if (static_cast<int>(frames_.size()) >= kMaxDepth) return false;
    frames_.push_back(Frame{object, {}, {}, {}});
    return true;
  }
  bool Close() {
    Frame f = std::move(frames_.back());
    frames_.pop_back();
    return Add(f.object ? JsonValue::Object(std::move(f.members))
                        : JsonValue::Array(std::move(f.items)));
  }

  std::vector<Frame> frames_;
  JsonValue root_;
  absl::Status error_;
};

}  // namespace

absl::StatusOr<JsonValue> ParseJson(absl::string_view text) {
  Builder builder;
  const bool parsed = nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
  return builder.Result(parsed);
}

}  // namespace offloadd::plan
