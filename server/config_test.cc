#include "server/config.h"

#include <fstream>

#include "gtest/gtest.h"

namespace offloadd {
namespace {

TEST(ConfigTest, DefaultsParseAndValidate) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool_bytes(), 1ull << 30);
  EXPECT_EQ(c->socket_mode(), 0660u);  // octal in the text
  EXPECT_EQ(c->backend(), "shm");
  EXPECT_EQ(c->chunk_bytes(), 8ull << 20);
  EXPECT_EQ(c->metrics_address(), "127.0.0.1:9464");
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(ConfigTest, FileOverridesIncludingZeroValues) {
  auto c = ParseConfig(
      "pool_bytes: 4194304\nmetrics_address: \"\"\n"
      "links { name: \"sw0\" gpus: \"a\" gpus: \"b\" d2h_bytes_per_second: 1e9 }\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool_bytes(), 4194304u);
  EXPECT_EQ(c->metrics_address(), "");
  EXPECT_EQ(c->backend(), "shm");  // untouched default
  auto o = ToCoreOptions(*c);
  ASSERT_EQ(o.links.size(), 1u);
  EXPECT_EQ(o.links[0].gpus.size(), 2u);
  EXPECT_DOUBLE_EQ(o.links[0].d2h_bytes_per_second, 1e9);
}

TEST(ConfigTest, SyntaxErrorNamesLine) {
  auto c = ParseConfig("pool_bytes: 1\nno_such_field: 3\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("line 2"), std::string::npos)
      << c.status();
}

TEST(ConfigTest, ValidationListsProblems) {
  auto c = ParseConfig("backend: \"tpu\"\nchunk_bytes: 10\npool_bytes: 5\n");
  ASSERT_TRUE(c.ok());
  absl::Status st = ValidateConfig(*c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  std::string msg(st.message());
  EXPECT_NE(msg.find("tpu"), std::string::npos);
  EXPECT_NE(msg.find("chunk_bytes"), std::string::npos);
  EXPECT_NE(msg.find("pool_bytes"), std::string::npos);
}

TEST(ConfigTest, FlagsOverrideWithSizesAndDashes) {
  auto c = ParseConfig("");
  ASSERT_TRUE(ApplyFlag("pool-bytes", "64MiB", &*c).ok());
  EXPECT_EQ(c->pool_bytes(), 64ull << 20);
  ASSERT_TRUE(ApplyFlag("default_link_bytes_per_second", "2GB", &*c).ok());
  EXPECT_DOUBLE_EQ(c->default_link_bytes_per_second(), 2e9);
  ASSERT_TRUE(ApplyFlag("socket_mode", "0600", &*c).ok());
  EXPECT_EQ(c->socket_mode(), 0600u);
  EXPECT_EQ(ApplyFlag("pool_bytes", "lots", &*c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyFlag("bogus", "1", &*c).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 1610612736u);
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
}

TEST(ConfigTest, MissingFileIsNotFound) {
  EXPECT_EQ(LoadConfigFile("/nonexistent/offloadd.conf").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace offloadd
