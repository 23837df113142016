#include "client/plan/json_value.h"

#include <string>

#include "gtest/gtest.h"

namespace offloadd::plan {
namespace {

TEST(JsonValue, ParsesAllKinds) {
  absl::StatusOr<JsonValue> v = ParseJson(
      R"( {"a": [1, -2.5e3, true, false, null], "s": "q\"\\\/\n\u00e9\ud83d\ude00",
           "o": {"k": {}}, "e": []} )");
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_TRUE(v->is_object());
  const JsonValue* a = v->Find("a");
  ASSERT_NE(a, nullptr);
  ASSERT_EQ(a->items().size(), 5u);
  EXPECT_EQ(a->items()[0].number(), 1.0);
  EXPECT_EQ(a->items()[1].number(), -2500.0);
  EXPECT_TRUE(a->items()[2].bool_value());
  EXPECT_EQ(a->items()[3].type(), JsonValue::Type::kBool);
  EXPECT_FALSE(a->items()[3].bool_value());
  EXPECT_TRUE(a->items()[4].is_null());
  EXPECT_EQ(v->Find("s")->string_value(), "q\"\\/\n\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_TRUE(v->Find("o")->Find("k")->is_object());
  EXPECT_TRUE(v->Find("e")->is_array());
  EXPECT_EQ(v->Find("missing"), nullptr);
  EXPECT_EQ(a->Find("x"), nullptr);  // not an object
}

TEST(JsonValue, LargeIntegersAreExact) {
  absl::StatusOr<JsonValue> v = ParseJson("[983040000000, 192937984]");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(static_cast<long long>(v->items()[0].number()), 983040000000LL);
  EXPECT_EQ(static_cast<long long>(v->items()[1].number()), 192937984LL);
}

TEST(JsonValue, RejectsMalformedInputWithOffset) {
  for (const char* bad : {"", "{", "{\"a\" 1}", "{\"a\": 1,}", "[1 2]", "01", "1.", "-", "\"abc",
                          "\"\\x\"", "tru", "{} x", "[1e]", "\"\\ud800\\u0041\"", "1e999"}) {
    absl::StatusOr<JsonValue> v = ParseJson(bad);
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(std::string(v.status().message()).find("at byte"), std::string::npos) << bad;
  }
  std::string deep(100, '[');
  deep += std::string(100, ']');
  EXPECT_FALSE(ParseJson(deep).ok());
}

}  // namespace
}  // namespace offloadd::plan
