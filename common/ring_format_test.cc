// The ring's layout, header checks, submission validation and completions.
#include "common/ring_format.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd::common {
namespace {

SubmissionEntry Zero() {
  SubmissionEntry e;
  std::memset(&e, 0, sizeof(e));
  return e;
}

SubmissionEntry Offload() {
  SubmissionEntry e = Zero();
  e.kind = static_cast<uint32_t>(SubmissionKind::kOffload);
  e.request_id = kRingRequestIdBit | 1;
  e.region_id = 1;
  e.size_bytes = 4096;
  e.tag = 7;
  return e;
}

SubmissionEntry Reload() {
  SubmissionEntry e = Zero();
  e.kind = static_cast<uint32_t>(SubmissionKind::kReload);
  e.request_id = kRingRequestIdBit | 2;
  e.region_id = 1;
  e.block_id = 3;
  e.priority = 1;
  e.flags = kSubmitReleaseAfter;
  e.deadline_seconds = 0.5;
  e.done_event_bytes = kRingEventBytes;
  e.done_event[0] = 9;
  return e;
}

TEST(RingFormatTest, LayoutPlacesSlotsAfterTheControlBlock) {
  RingLayout l;
  std::string error;
  ASSERT_TRUE(MakeRingLayout(64, 128, &l, &error)) << error;
  EXPECT_EQ(l.submission_offset, 512u);
  EXPECT_EQ(l.completion_offset, 512u + 64 * 256);
  EXPECT_EQ(l.total_bytes, 512u + 64 * 256 + 128 * 256);
  EXPECT_FALSE(MakeRingLayout(48, 128, &l, &error));  // not a power of two
  EXPECT_NE(error.find("powers of two"), std::string::npos);
  EXPECT_FALSE(MakeRingLayout(4, 128, &l, &error));
  EXPECT_FALSE(MakeRingLayout(64, 1u << 17, &l, &error));
}

TEST(RingFormatTest, ParsesTheHeaderItWroteAndRefusesEveryAlteredField) {
  RingLayout l;
  ASSERT_TRUE(MakeRingLayout(16, 32, &l, nullptr));
  std::vector<uint64_t> memory(l.total_bytes / 8, 0xdeadbeefdeadbeefull);
  InitRing(memory.data(), l);
  RingControl* control = ControlOf(memory.data());
  EXPECT_EQ(control->submission_tail.value.load(), 0u);
  EXPECT_EQ(control->state.closed.load(), 0u);
  const RingHeader good = control->header;
  RingLayout parsed;
  std::string error;
  ASSERT_TRUE(ParseRingHeader(good, l.total_bytes, &parsed, &error)) << error;
  EXPECT_EQ(parsed.completion_offset, l.completion_offset);
  EXPECT_FALSE(ParseRingHeader(good, l.total_bytes + 4096, &parsed, &error));
  EXPECT_NE(error.find("bytes but its header"), std::string::npos);
  // Each 32-bit word of the header altered in turn: every one is refused.
  for (size_t word = 0; word < sizeof(RingHeader) / 4; ++word) {
    RingHeader bad = good;
    reinterpret_cast<uint32_t*>(&bad)[word] ^= 0x10;
    EXPECT_FALSE(ParseRingHeader(bad, l.total_bytes, &parsed, &error)) << "word " << word;
  }
}

TEST(RingFormatTest, AcceptsWellFormedSubmissions) {
  std::string error;
  EXPECT_TRUE(ValidateSubmission(Offload(), &error)) << error;
  EXPECT_TRUE(ValidateSubmission(Reload(), &error)) << error;
  SubmissionEntry release = Zero();
  release.kind = static_cast<uint32_t>(SubmissionKind::kRelease);
  release.request_id = kRingRequestIdBit | 3;
  release.tag = 7;
  EXPECT_TRUE(ValidateSubmission(release, &error)) << error;
  SubmissionEntry ordered = Offload();
  ordered.flags = kSubmitOrdering;
  ordered.order_step = 4;
  ordered.order_position = 2;
  EXPECT_TRUE(ValidateSubmission(ordered, &error)) << error;
}

TEST(RingFormatTest, RefusesMalformedSubmissionsSayingWhy) {
  struct Case {
    const char* what;
    SubmissionEntry entry;
    const char* says;
  };
  std::vector<Case> cases;
  auto add = [&](const char* what, SubmissionEntry e, const char* says) {
    cases.push_back({what, e, says});
  };
  SubmissionEntry e = Offload();
  e.kind = 0;
  add("kind 0", e, "unknown ring submission kind");
  e = Offload();
  e.kind = 4;
  add("kind 4", e, "unknown ring submission kind");
  e = Offload();
  e.request_id = 5;
  add("id without bit 63", e, "bit 63");
  e = Offload();
  e.flags = kSubmitReleaseAfter;
  add("release_after on an offload", e, "release_after is for reloads");
  e = Reload();
  e.flags = 1u << 7;
  add("unknown flag", e, "unknown");
  e = Reload();
  e.done_event_bytes = 63;
  add("short event", e, "0 or 64 bytes");
  e = Reload();
  e.deadline_seconds = std::numeric_limits<double>::quiet_NaN();
  add("NaN deadline", e, "finite");
  e = Reload();
  e.deadline_seconds = -1;
  add("negative deadline", e, "finite");
  e = Offload();
  e.reserved[39] = 1;
  add("reserved byte", e, "reserved");
  e = Offload();
  e.priority = 1;
  add("priority on an offload", e, "does not use");
  e = Offload();
  e.block_id = 3;
  add("block id on an offload", e, "does not use");
  e = Offload();
  e.order_step = 3;
  add("ordering without its flag", e, "does not use");
  e = Reload();
  e.done_event_bytes = 0;
  add("event bytes without their length", e, "does not use");
  e = Reload();
  e.size_bytes = 4096;
  add("size on a reload", e, "does not use");
  for (const Case& c : cases) {
    std::string error;
    EXPECT_FALSE(ValidateSubmission(c.entry, &error)) << c.what;
    EXPECT_NE(error.find(c.says), std::string::npos) << c.what << ": " << error;
  }
}

TEST(RingFormatTest, CompletionsSetEveryByteAndTruncateTheMessage) {
  const std::string long_message(500, 'x');
  CompletionEntry c = MakeCompletion(kRingRequestIdBit | 9, CompletionKind::kError, 5,
                                     long_message);
  EXPECT_EQ(c.request_id, kRingRequestIdBit | 9);
  EXPECT_EQ(c.status_code, 5);
  EXPECT_EQ(c.message_bytes, kCompletionMessageBytes);
  EXPECT_EQ(std::string(c.message, c.message_bytes), long_message.substr(0, 200));
  CompletionEntry s = MakeCompletion(1, CompletionKind::kReleased, 0, "ok");
  EXPECT_EQ(s.message_bytes, 2u);
  EXPECT_EQ(s.message[2], 0);  // the rest is zero, not stack garbage
  EXPECT_EQ(s.block_id, 0u);
}

}  // namespace
}  // namespace offloadd::common
