#include "server/base/log_text.h"

#include <string>

#include "gtest/gtest.h"

namespace offloadd::base {
namespace {

TEST(LogText, ANewlineCannotStartALineOfItsOwn) {
  const std::string forged = "w\naudit: end_session by_uid=0 session=1 reason=\"x\" outcome=OK";
  const std::string logged = LogText(forged);
  EXPECT_EQ(logged.find('\n'), std::string::npos);
  EXPECT_EQ(logged, "w\\naudit: end_session by_uid=0 session=1 reason=\\\"x\\\" outcome=OK");
  EXPECT_EQ(LogText(std::string("a\rb\0c", 5)), "a\\rb\\000c");
}

TEST(LogText, LongTextIsCutAndItsLengthNamed) {
  EXPECT_EQ(LogText(std::string(300, 'x'), 4), "xxxx...[300B]");
  EXPECT_EQ(LogText("abcd", 4), "abcd");
}

}  // namespace
}  // namespace offloadd::base
