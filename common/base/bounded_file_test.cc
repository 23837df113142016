#include "common/base/bounded_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace offloadd::base {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/bounded_file_" + name;
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(ReadBoundedFile, ReadsARegularFileWhole) {
  const std::string path = WriteFile("small", "pool_bytes: 64MiB\n");
  auto text = ReadBoundedFile(path, 1024, "config file");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "pool_bytes: 64MiB\n");
}

TEST(ReadBoundedFile, AFileOfExactlyTheBoundIsRead) {
  const std::string path = WriteFile("exact", std::string(100, 'x'));
  auto text = ReadBoundedFile(path, 100, "config file");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(text->size(), 100u);
}

TEST(ReadBoundedFile, ALargerFileIsOutOfRange) {
  const std::string path = WriteFile("large", std::string(101, 'x'));
  auto text = ReadBoundedFile(path, 100, "config file");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(text.status().message().find("larger than 100 bytes"), std::string::npos)
      << text.status();
}

TEST(ReadBoundedFile, DevZeroIsRefusedNotRead) {
  auto text = ReadBoundedFile("/dev/zero", 1 << 20, "config file");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(text.status().message().find("character device"), std::string::npos)
      << text.status();
}

TEST(ReadBoundedFile, DevNullReadsAsEmpty) {
  auto text = ReadBoundedFile("/dev/null", 1 << 20, "config file");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "");
}

TEST(ReadBoundedFile, AFifoWithoutAWriterIsRefusedWithoutBlocking) {
  const std::string path = TempPath("fifo");
  unlink(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  auto text = ReadBoundedFile(path, 1 << 20, "config file");  // blocked forever before
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(text.status().message().find("a FIFO"), std::string::npos) << text.status();
  unlink(path.c_str());
}

TEST(ReadBoundedFile, ADirectoryIsRefused) {
  auto text = ReadBoundedFile("/", 1 << 20, "config file");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(text.status().message().find("a directory"), std::string::npos) << text.status();
}

TEST(ReadBoundedFile, AMissingFileIsNotFound) {
  auto text = ReadBoundedFile(TempPath("missing"), 1 << 20, "--hf-config file");
  EXPECT_EQ(text.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(text.status().message().find("--hf-config file"), std::string::npos)
      << text.status();
}

TEST(ReadBoundedFile, AProcFileOfSizeZeroIsReadUpToTheBound) {
  auto text = ReadBoundedFile("/proc/self/status", 1 << 20, "status");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("Pid:"), std::string::npos);
}

}  // namespace
}  // namespace offloadd::base
