// RingFrontEnd without gRPC: a memfd ring made as a client makes it, a fake session (`handle`
// records requests and answers them), and the hostile cases: malformed entries, impossible
// indices, a client that never takes its completions, objects the daemon must refuse.
#include "server/rpc/ring_frontend.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "common/ring_memfd.h"
#include "gtest/gtest.h"
#include "server/metrics/metrics.h"

namespace offloadd::rpc {
namespace {

using common::CompletionEntry;
using common::RingResult;
using common::SubmissionEntry;

bool WaitFor(const std::function<bool()>& pred, double seconds = 10) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return pred();
}

std::string ProcPath(int fd) { return "/proc/self/fd/" + std::to_string(fd); }

// A client's view of a ring, and a front-end serving it with a fake session.
struct Fixture {
  explicit Fixture(uint32_t entries = 16, bool answer = true) : answer(answer) {
    std::string error;
    if (!common::CreateRingMemfd(entries, entries, &ring, &error)) abort();
    control = common::ControlOf(ring.base);
    submit = {common::SubmissionSlots(ring.base, ring.layout), entries, &control->submission_tail,
              &control->submission_head};
    take = {common::CompletionSlots(ring.base, ring.layout), entries, &control->completion_tail,
            &control->completion_head};
    auto attached = RingFrontEnd::AttachPath(
        ProcPath(ring.fd), getuid(),
        [this](const session::Request& r) { return OnRequest(r); },
        [this](const absl::Status& why) {
          std::lock_guard<std::mutex> lock(mu);
          ended = why;
        },
        RingFrontEnd::Waiting{},
        [this](const absl::Status& why) {
          std::lock_guard<std::mutex> lock(mu);
          refused.push_back(why);
        });
    if (!attached.ok()) abort();
    front = *std::move(attached);
    front->Start();
  }
  ~Fixture() {
    front->Stop();  // joins the ring thread, which reads `front` in OnRequest
    front.reset();
    common::DestroyRingMemfd(&ring);
  }
  // The fake session: records and answers `r`; once `session_end` is set, takes nothing (as
  // Session::Handle after the session ended) and returns it.
  absl::Status OnRequest(const session::Request& r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!session_end.ok()) {
        ++not_taken;
        return session_end;
      }
      requests.push_back(r);
    }
    if (!answer) return absl::OkStatus();
    session::Completion c;
    c.request_id = r.request_id;
    c.kind = session::CompletionKind::kOffloadDone;
    c.id = 1000 + (r.request_id & ~common::kRingRequestIdBit);
    c.bytes = r.bytes;
    front->Complete(c);
    return absl::OkStatus();
  }
  void Submit(const SubmissionEntry& e) {
    ASSERT_EQ(submit.TryPush(e), RingResult::kOk);
    control->daemon_doorbell.Ring();
  }
  // Waits for the next completion (as a client does, on its doorbell).
  CompletionEntry Take() {
    CompletionEntry c{};
    for (;;) {
      if (take.TryPop(&c) == RingResult::kOk) break;
      const uint32_t seen = control->client_doorbell.Arm();
      if (take.Available() == RingResult::kEmpty) control->client_doorbell.Sleep(seen, 0.05);
      control->client_doorbell.Disarm();
    }
    control->daemon_doorbell.Ring();
    return c;
  }
  size_t request_count() {
    std::lock_guard<std::mutex> lock(mu);
    return requests.size();
  }
  absl::Status end_status() {
    std::lock_guard<std::mutex> lock(mu);
    return ended;
  }

  bool answer;
  common::RingMemfd ring;
  common::RingControl* control;
  common::RingProducer<SubmissionEntry> submit;
  common::RingConsumer<CompletionEntry> take;
  std::unique_ptr<RingFrontEnd> front;
  std::mutex mu;
  std::vector<session::Request> requests;
  absl::Status ended;
  absl::Status session_end;             // set: the fake session has ended
  int not_taken = 0;                    // requests handed after it ended
  std::vector<absl::Status> refused;    // counted through the Refused callback
};

SubmissionEntry Offload(uint64_t n) {
  SubmissionEntry e;
  std::memset(&e, 0, sizeof(e));
  e.kind = static_cast<uint32_t>(common::SubmissionKind::kOffload);
  e.request_id = common::kRingRequestIdBit | n;
  e.region_id = 3;
  e.offset_bytes = 4096 * n;
  e.size_bytes = 4096;
  e.tag = n;
  return e;
}

TEST(RingFrontEndTest, HandsEachSubmissionToTheSessionAndAnswersOnTheRing) {
  Fixture f;
  for (uint64_t n = 1; n <= 100; ++n) {  // 100 through 16 slots
    f.Submit(Offload(n));
    const CompletionEntry c = f.Take();
    EXPECT_EQ(c.request_id, common::kRingRequestIdBit | n);
    EXPECT_EQ(c.kind, static_cast<uint32_t>(common::CompletionKind::kOffloadDone));
    EXPECT_EQ(c.block_id, 1000 + n);
    EXPECT_EQ(c.bytes, 4096u);
  }
  ASSERT_EQ(f.request_count(), 100u);
  const session::Request& r = f.requests[41];
  EXPECT_EQ(r.kind, session::RequestKind::kOffload);
  EXPECT_EQ(r.region_id, 3u);
  EXPECT_EQ(r.offset, 4096u * 42);
  EXPECT_EQ(r.tag, 42u);
  EXPECT_TRUE(f.end_status().ok());
}

// Waits up to 5 s for the ring thread to advertise `us` (a correctness bound, not a timing).
bool PollingBecomes(const common::RingControl* control, uint32_t us) {
  for (int i = 0; i < 5000; ++i) {
    if (control->state.poll_microseconds.load() == us) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

// After work the thread polls: it advertises the interval and takes a submission nobody rang
// for; a poll window after its last work it stops advertising and sleeps until rung.
TEST(RingFrontEndTest, TakesUnrungSubmissionsWhilePollingAndStopsWhenIdle) {
  const double polls0 = metrics::Get().ring_sleeps_poll_total->Value();
  Fixture f;
  f.Submit(Offload(1));
  f.Take();
  ASSERT_TRUE(PollingBecomes(f.control, 500));  // RingWaiting's default 0.5 ms
  ASSERT_EQ(f.submit.TryPush(Offload(2)), RingResult::kOk);  // published, not rung
  const CompletionEntry c = f.Take();  // Take sleeps on the client's doorbell only
  EXPECT_EQ(c.request_id, common::kRingRequestIdBit | 2);
  EXPECT_GT(f.front->counters().polls, 0u);
  const double doorbell0 = metrics::Get().ring_sleeps_doorbell_total->Value();
  EXPECT_TRUE(PollingBecomes(f.control, 0));  // common::kRingPollWindowSeconds later
  f.Submit(Offload(3));  // rung: served from the untimed sleep
  EXPECT_EQ(f.Take().request_id, common::kRingRequestIdBit | 3);
  EXPECT_EQ(f.request_count(), 3u);
  // Exported as the counters say (read once the thread stopped): the timed sleeps by `wait`,
  // and the untimed one after the window, woken above.
  f.front->Stop();
  const RingFrontEnd::Counters counters = f.front->counters();
  EXPECT_EQ(metrics::Get().ring_sleeps_poll_total->Value() - polls0, counters.polls);
  EXPECT_GE(metrics::Get().ring_sleeps_doorbell_total->Value() - doorbell0, 1.0);
}

// A timed poll that finds nothing is not a client ringing for nothing: while the thread polls
// it never backs off (a 1 ms sleep, unarmed, that an urgent reload rung meanwhile would wait
// out).
TEST(RingFrontEndTest, TimedPollsThatFindNothingNeverBackOff) {
  Fixture f;
  f.Submit(Offload(1));
  f.Take();
  ASSERT_TRUE(PollingBecomes(f.control, 500));
  ASSERT_TRUE(PollingBecomes(f.control, 0));  // the poll window passed, without work
  const RingFrontEnd::Counters c = f.front->counters();
  ASSERT_GT(c.polls, 64u);  // enough empty polls in a row for a back-off, were they counted
  EXPECT_EQ(c.backoffs, 0u);
}

// A client ringing the doorbell with no work backs its own ring thread off, which then still
// serves it.
TEST(RingFrontEndTest, AClientRingingForNothingBacksItsRingThreadOff) {
  const double backoffs0 = metrics::Get().ring_backoffs_total->Value();
  Fixture f;
  ASSERT_TRUE(WaitFor([&] {
    f.control->daemon_doorbell.RingAlways();
    return f.front->counters().backoffs > 0;
  }));
  f.Submit(Offload(1));
  EXPECT_EQ(f.Take().request_id, common::kRingRequestIdBit | 1);
  f.front->Stop();
  EXPECT_EQ(metrics::Get().ring_backoffs_total->Value() - backoffs0,
            f.front->counters().backoffs);
}

TEST(RingFrontEndTest, RefusesAMalformedEntryOnTheRingAndKeepsServing) {
  const double malformed0 = metrics::Get().ring_malformed_entries_total->Value();
  Fixture f;
  SubmissionEntry bad = Offload(1);
  bad.reserved[3] = 0xff;
  f.Submit(bad);
  CompletionEntry c = f.Take();
  EXPECT_EQ(c.kind, static_cast<uint32_t>(common::CompletionKind::kError));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(std::string(c.message, c.message_bytes).find("reserved"), std::string::npos);
  f.Submit(Offload(2));
  c = f.Take();
  EXPECT_EQ(c.kind, static_cast<uint32_t>(common::CompletionKind::kOffloadDone));
  EXPECT_EQ(f.request_count(), 1u);  // the malformed entry never reached the session
  EXPECT_EQ(f.front->counters().malformed, 1u);
  EXPECT_EQ(metrics::Get().ring_malformed_entries_total->Value() - malformed0, 1.0);
  std::lock_guard<std::mutex> lock(f.mu);
  ASSERT_EQ(f.refused.size(), 1u);  // counted among the session's request errors
  EXPECT_EQ(f.refused[0].code(), absl::StatusCode::kInvalidArgument);
}

// A session that ended while its ring still runs (the stream's reactor, which stops the ring,
// goes later): the entry that finds it ended is answered with the session's end status, and
// no later entry is taken, so every entry taken has exactly one answer.
TEST(RingFrontEndTest, AnEntryForAnEndedSessionIsAnsweredAndNoMoreAreTaken) {
  Fixture f;
  f.Submit(Offload(1));
  EXPECT_EQ(f.Take().kind, static_cast<uint32_t>(common::CompletionKind::kOffloadDone));
  {
    std::lock_guard<std::mutex> lock(f.mu);
    f.session_end = absl::UnavailableError("offloadd is shutting down");
  }
  f.Submit(Offload(2));
  const CompletionEntry c = f.Take();
  EXPECT_EQ(c.request_id, common::kRingRequestIdBit | 2);
  EXPECT_EQ(c.kind, static_cast<uint32_t>(common::CompletionKind::kError));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(absl::StatusCode::kUnavailable));
  EXPECT_EQ(std::string(c.message, c.message_bytes), "offloadd is shutting down");
  for (uint64_t n = 3; n <= 6; ++n) f.Submit(Offload(n));
  // Each submission rang the ring thread; none was taken (the slots stay the client's).
  for (int i = 0; i < 200 && f.front->counters().sleeps < 4; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CompletionEntry none{};
  EXPECT_EQ(f.take.TryPop(&none), RingResult::kEmpty);
  EXPECT_EQ(f.front->counters().submissions, 2u);
  std::lock_guard<std::mutex> lock(f.mu);
  EXPECT_EQ(f.not_taken, 1);
  EXPECT_EQ(f.requests.size(), 1u);
}

TEST(RingFrontEndTest, ASubmissionTailOutOfRangeEndsTheSessionSayingSo) {
  Fixture f;
  f.control->submission_tail.value.store(1000);  // 1000 entries in 16 slots
  f.control->daemon_doorbell.RingAlways();
  ASSERT_TRUE(WaitFor([&] { return !f.end_status().ok(); }));
  EXPECT_EQ(f.end_status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f.end_status().message().find("submission tail"), std::string::npos);
  EXPECT_EQ(f.request_count(), 0u);
}

TEST(RingFrontEndTest, ACompletionHeadMovedBackwardsEndsTheSession) {
  Fixture f;
  f.Submit(Offload(1));
  f.Take();
  f.control->completion_head.value.store(0xfffffff0u);  // behind what the daemon wrote
  f.Submit(Offload(2));
  ASSERT_TRUE(WaitFor([&] { return !f.end_status().ok(); }));
  EXPECT_NE(f.end_status().message().find("completion head"), std::string::npos);
}

// A client that submits without ever taking a completion: the daemon queues at most
// kMaxQueuedCompletions in its own memory and then stops taking submissions.
TEST(RingFrontEndTest, AClientThatNeverTakesCompletionsIsHeldAtTheBound) {
  prometheus::Gauge& waiting = *metrics::Get().ring_completions_waiting;
  const double waiting0 = waiting.Value();
  Fixture f(/*entries=*/1024);
  uint64_t n = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  // Keep the submission ring full until the front-end stops taking (paused).
  uint64_t last_taken = ~0ull;
  int stable = 0;
  while (stable < 50 && std::chrono::steady_clock::now() < until) {
    while (f.submit.TryPush(Offload(++n)) == RingResult::kOk) {
    }
    f.control->daemon_doorbell.Ring();
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    const uint64_t taken = f.front->counters().submissions;
    stable = taken == last_taken ? stable + 1 : 0;
    last_taken = taken;
  }
  const RingFrontEnd::Counters c = f.front->counters();
  EXPECT_EQ(c.completions, 1024u);  // the completion ring is full
  EXPECT_GE(c.queued_peak, RingFrontEnd::kMaxQueuedCompletions);
  EXPECT_LE(c.queued_peak, RingFrontEnd::kMaxQueuedCompletions + RingFrontEnd::kTakeBatch);
  EXPECT_EQ(c.submissions, c.completions + c.queued_peak);
  EXPECT_TRUE(f.end_status().ok());  // not an error: the client is only slow
  EXPECT_EQ(waiting.Value() - waiting0, c.submissions - c.completions);  // exported
  // Taking completions lets it go on.
  for (int i = 0; i < 1024; ++i) f.Take();
  ASSERT_TRUE(WaitFor([&] { return f.front->counters().submissions > c.submissions; }));
  // Stopped, its waiting answers are dropped (nobody reads the ring any more), and the gauge
  // says so.
  f.front->Stop();
  EXPECT_EQ(waiting.Value(), waiting0);
}

// The gauge of ring threads counts a front end from Start to Stop.
TEST(RingFrontEndTest, RingThreadsGaugeCountsStartedFrontEnds) {
  prometheus::Gauge& threads = *metrics::Get().ring_threads;
  const double before = threads.Value();
  {
    Fixture f;
    EXPECT_EQ(threads.Value() - before, 1.0);
    f.front->Stop();
    EXPECT_EQ(threads.Value(), before);
    f.front->Stop();  // idempotent: counted once
    EXPECT_EQ(threads.Value(), before);
  }
  EXPECT_EQ(threads.Value(), before);
}

TEST(RingFrontEndTest, StopMarksTheRingClosedAndWakesTheClient) {
  Fixture f;
  std::thread waiter([&] {
    for (;;) {
      const uint32_t seen = f.control->client_doorbell.Arm();
      const bool closed = f.control->state.closed.load() != 0;
      if (!closed) f.control->client_doorbell.Sleep(seen, -1);
      f.control->client_doorbell.Disarm();
      if (closed) return;
    }
  });
  f.front->Stop();
  waiter.join();  // hangs if the wake were lost
  EXPECT_EQ(f.control->state.closed.load(), 1u);
}

TEST(RingFrontEndTest, RefusesObjectsThatAreNotSealedRingsOfTheSessionsUid) {
  auto handle = [](const session::Request&) { return absl::OkStatus(); };
  auto end = [](const absl::Status&) {};
  common::RingMemfd ring;
  std::string error;
  ASSERT_TRUE(common::CreateRingMemfd(16, 16, &ring, &error)) << error;
  auto other_uid = RingFrontEnd::AttachPath(ProcPath(ring.fd), getuid() + 1, handle, end);
  EXPECT_EQ(other_uid.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(other_uid.status().message().find("belongs to uid"), std::string::npos);
  common::ControlOf(ring.base)->header.magic ^= 1;
  auto bad_magic = RingFrontEnd::AttachPath(ProcPath(ring.fd), getuid(), handle, end);
  EXPECT_EQ(bad_magic.status().code(), absl::StatusCode::kInvalidArgument);
  common::DestroyRingMemfd(&ring);

  const int unsealed = memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(unsealed, 0);
  ASSERT_EQ(ftruncate(unsealed, 512 + 16 * 256 * 2), 0);
  auto not_sealed = RingFrontEnd::AttachPath(ProcPath(unsealed), getuid(), handle, end);
  EXPECT_EQ(not_sealed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(not_sealed.status().message().find("F_SEAL_SHRINK"), std::string::npos);
  close(unsealed);
  auto missing = RingFrontEnd::AttachPath("/proc/self/fd/100000", getuid(), handle, end);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kPermissionDenied);
  // A root daemon is not told to run as root.
  EXPECT_EQ(missing.status().message().find("as root") == std::string::npos, geteuid() == 0)
      << missing.status().message();
}

TEST(RingFrontEndTest, ADescriptorNotOpenInTheClientIsNamedWithItsProcess) {
  auto missing = RingFrontEnd::Attach(
      getpid(), 100000, getuid(), [](const session::Request&) { return absl::OkStatus(); },
      [](const absl::Status&) {});
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string why(missing.status().message());
  EXPECT_NE(why.find("descriptor 100000 is not open in the client process " +
                     std::to_string(getpid())),
            std::string::npos)
      << why;
  EXPECT_EQ(why.find("as root"), std::string::npos) << why;
}

// One ring is one SPSC channel: a second session offered the same memfd (even through another
// descriptor) is refused while the first is attached, and may attach it once the first stops.
TEST(RingFrontEndTest, ARingAttachedToALiveSessionIsRefusedToAnother) {
  Fixture f;
  const int second_fd = dup(f.ring.fd);
  ASSERT_GE(second_fd, 0);
  auto handle = [](const session::Request&) { return absl::OkStatus(); };
  auto end = [](const absl::Status&) {};
  auto second = RingFrontEnd::AttachPath(ProcPath(second_fd), getuid(), handle, end);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("already attached to another session"),
            std::string::npos)
      << second.status().message();
  // The first session keeps serving.
  f.Submit(Offload(1));
  const CompletionEntry c = f.Take();
  EXPECT_EQ(c.request_id, common::kRingRequestIdBit | 1);
  EXPECT_EQ(c.block_id, 1001u);
  EXPECT_EQ(f.control->state.closed.load(), 0u);
  EXPECT_TRUE(f.end_status().ok());

  f.front->Stop();
  auto after = RingFrontEnd::AttachPath(ProcPath(second_fd), getuid(), handle, end);
  EXPECT_TRUE(after.ok()) << after.status();
  close(second_fd);
}

// A client offering a pty slave as its ring: a daemon that opened it without O_NOCTTY, as a
// session leader with no terminal (as systemd runs it), took it as its controlling terminal,
// and the client could then send it SIGINT through the master. The object must be refused
// without that side effect. Runs in a child that makes itself such a session leader.
TEST(RingFrontEndTest, APtyOfferedAsTheRingIsRefusedWithoutBecomingTheDaemonsTerminal) {
  const int master = posix_openpt(O_RDWR | O_NOCTTY);
  ASSERT_GE(master, 0);
  ASSERT_EQ(grantpt(master), 0);
  ASSERT_EQ(unlockpt(master), 0);
  const std::string slave_path = ptsname(master);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    if (setsid() < 0) _exit(10);
    const int slave = open(slave_path.c_str(), O_RDWR | O_NOCTTY);  // the client's fd
    if (slave < 0) _exit(11);
    auto attached = RingFrontEnd::AttachPath(
        ProcPath(slave), getuid(), [](const session::Request&) { return absl::OkStatus(); },
        [](const absl::Status&) {});
    if (attached.ok() || attached.status().code() != absl::StatusCode::kFailedPrecondition) {
      _exit(12);
    }
    // /dev/tty opens only for a process with a controlling terminal.
    const int tty = open("/dev/tty", O_RDWR | O_NOCTTY);
    _exit(tty >= 0 ? 13 : 0);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  close(master);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0)
      << "10/11: set-up failed; 12: not refused as not a memory object; 13: the pty became "
         "the controlling terminal";
}

}  // namespace
}  // namespace offloadd::rpc
