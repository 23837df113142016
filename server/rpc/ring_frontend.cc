#include "server/rpc/ring_frontend.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_format.h"
#include "server/metrics/metrics.h"
#include "server/rpc/ring_translate.h"

namespace offloadd::rpc {
namespace {

using common::RingResult;

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The largest object a ring of kMaxRingEntries each way takes.
uint64_t MaxRingBytes() {
  common::RingLayout l;
  common::MakeRingLayout(common::kMaxRingEntries, common::kMaxRingEntries, &l, nullptr);
  return l.total_bytes;
}

// Checks the opened object (its descriptor `fd`; a regular file of the session's uid, as
// OpenRingObject checked) is sealed against shrinking and of a ring's size; `*st` gets its stat.
// The seal is read first: once F_SEAL_SHRINK is set the size read after it can only grow, so a
// client cannot shrink the object under the mapping made from that size (a read past the end of
// a file is SIGBUS in the daemon).
absl::Status CheckRingObject(int fd, const std::string& path, struct stat* st) {
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals < 0 || (seals & F_SEAL_SHRINK) == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the ring %s is not sealed against shrinking: create it with memfd_create("
        "MFD_ALLOW_SEALING) and add F_SEAL_SHRINK after sizing it",
        path));
  }
  if (fstat(fd, st) != 0) {
    return absl::InternalError(absl::StrFormat("fstat(%s): %s", path, strerror(errno)));
  }
  const auto size = static_cast<uint64_t>(st->st_size);
  if (size < sizeof(common::RingControl) || size > MaxRingBytes()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the ring %s is %d bytes, not the size of any ring (%d to %d)", path, size,
        sizeof(common::RingControl), MaxRingBytes()));
  }
  return absl::OkStatus();
}

// Why the daemon could not open the ring at `path`. Advises running the daemon as root only
// when it is not root already.
absl::Status CannotOpen(const std::string& path, int err) {
  const std::string advice =
      geteuid() == 0
          ? "offer a memfd the connecting process created and keeps open"
          : "run the daemon as root or as the client's uid to use the ring";
  return absl::PermissionDeniedError(
      absl::StrFormat("the daemon (uid %d) cannot open the ring %s: %s; %s (requests go on the "
                      "stream meanwhile)",
                      geteuid(), path, strerror(err), advice));
}

// The rings attached to live sessions, by file identity (st_dev, st_ino): one ring is one
// single-producer single-consumer channel, so it serves one session at a time.
struct AttachedRings {
  base::Mutex mu;
  std::set<std::pair<dev_t, ino_t>> ids GUARDED_BY(mu);
};

AttachedRings& Attached() {
  static auto* rings = new AttachedRings;
  return *rings;
}

// Claims the ring `id` for one session; false when a live session has it.
bool ClaimRing(const std::pair<dev_t, ino_t>& id) {
  AttachedRings& rings = Attached();
  base::MutexLock lock(rings.mu);
  return rings.ids.insert(id).second;
}

void ReleaseRing(const std::pair<dev_t, ino_t>& id) {
  AttachedRings& rings = Attached();
  base::MutexLock lock(rings.mu);
  rings.ids.erase(id);
}

// Opens the client's object for reading and writing only once it is known to be a regular file
// of the session's uid. The first open is O_PATH: it runs no driver's open and cannot make a
// terminal the daemon's controlling terminal (a client offering a pty slave would otherwise
// send the root daemon SIGINT through the master). The object is then reopened through that
// descriptor, so the checked inode is the one opened; O_NOCTTY and O_NONBLOCK guard the reopen.
absl::StatusOr<int> OpenRingObject(const std::string& path, uid_t uid) {
  const int handle = open(path.c_str(), O_PATH | O_CLOEXEC);
  if (handle < 0) return CannotOpen(path, errno);
  struct stat st;
  absl::Status ok = fstat(handle, &st) == 0
                        ? absl::OkStatus()
                        : absl::InternalError(absl::StrFormat("fstat(%s): %s", path,
                                                              strerror(errno)));
  if (ok.ok() && !S_ISREG(st.st_mode)) {
    ok = absl::FailedPreconditionError(absl::StrFormat(
        "the ring %s is not a regular memory object: offer a memfd", path));
  } else if (ok.ok() && st.st_uid != uid) {
    ok = absl::PermissionDeniedError(absl::StrFormat(
        "the ring %s belongs to uid %d, not to the session's uid %d: offer a ring the "
        "connecting process created",
        path, st.st_uid, uid));
  }
  int fd = -1;
  if (ok.ok()) {
    fd = open(absl::StrFormat("/proc/self/fd/%d", handle).c_str(),
              O_RDWR | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
    if (fd < 0) ok = CannotOpen(path, errno);
  }
  close(handle);
  if (!ok.ok()) return ok;
  return fd;
}

// Maps the ring at `path` and checks its header; on success *base / *layout describe it and
// *id is its file's identity.
absl::Status MapRing(const std::string& path, uid_t uid, void** base, common::RingLayout* layout,
                     std::pair<dev_t, ino_t>* id) {
  absl::StatusOr<int> opened = OpenRingObject(path, uid);
  if (!opened.ok()) return opened.status();
  const int fd = *opened;
  struct stat st;
  absl::Status ok = CheckRingObject(fd, path, &st);
  void* p = MAP_FAILED;
  if (ok.ok()) {
    p = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
      ok = absl::ResourceExhaustedError(
          absl::StrFormat("the daemon cannot map the ring %s: %s", path, strerror(errno)));
    }
  }
  close(fd);
  if (!ok.ok()) return ok;
  common::RingHeader header;
  std::memcpy(&header, p, sizeof(header));  // read once, checked as a copy
  std::string why;
  if (!common::ParseRingHeader(header, st.st_size, layout, &why)) {
    munmap(p, st.st_size);
    return absl::InvalidArgumentError("the ring " + path + " was refused: " + why);
  }
  *base = p;
  *id = {st.st_dev, st.st_ino};
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RingFrontEnd>> RingFrontEnd::Attach(int32_t pid, uint32_t fd,
                                                                   uid_t uid, Handle handle,
                                                                   End end, Waiting waiting,
                                                                   Refused refused) {
  const std::string path = absl::StrFormat("/proc/%d/fd/%d", pid, fd);
  struct stat st;
  if (lstat(path.c_str(), &st) != 0 && errno == ENOENT) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "descriptor %d is not open in the client process %d (the daemon opens the ring as %s): "
        "name in Hello.ring.fd the descriptor of a ring the connecting process keeps open "
        "(NativeRing.fd, offloadd_ring_fd()); requests go on the stream meanwhile",
        fd, pid, path));
  }
  return AttachPath(path, uid, std::move(handle), std::move(end), waiting, std::move(refused));
}

absl::StatusOr<std::unique_ptr<RingFrontEnd>> RingFrontEnd::AttachPath(const std::string& path,
                                                                       uid_t uid, Handle handle,
                                                                       End end,
                                                                       Waiting waiting,
                                                                       Refused refused) {
  void* base = nullptr;
  common::RingLayout layout;
  std::pair<dev_t, ino_t> id;
  if (absl::Status st = MapRing(path, uid, &base, &layout, &id); !st.ok()) return st;
  if (!ClaimRing(id)) {
    munmap(base, layout.total_bytes);
    return absl::FailedPreconditionError(absl::StrFormat(
        "the ring %s is already attached to another session (a ring serves one session): "
        "offer a new ring for each session; requests go on the stream meanwhile",
        path));
  }
  return std::unique_ptr<RingFrontEnd>(
      new RingFrontEnd(base, layout, id, std::move(handle), std::move(end), waiting,
                       std::move(refused)));
}

RingFrontEnd::RingFrontEnd(void* base, const common::RingLayout& layout,
                           std::pair<dev_t, ino_t> ring_id, Handle handle, End end,
                           Waiting waiting, Refused refused)
    : base_(base),
      layout_(layout),
      ring_id_(ring_id),
      control_(common::ControlOf(base)),
      handle_(std::move(handle)),
      end_(std::move(end)),
      waiting_(waiting),
      refused_(std::move(refused)),
      submissions_(common::SubmissionSlots(base, layout), layout.submission_entries,
                   &control_->submission_tail, &control_->submission_head) {
  {
    base::MutexLock lock(mu_);
    completions_ = common::RingProducer<common::CompletionEntry>(
        common::CompletionSlots(base, layout), layout.completion_entries,
        &control_->completion_tail, &control_->completion_head);
  }
}

void RingFrontEnd::Start() {
  if (thread_.joinable()) return;
  metrics::Get().ring_threads->Increment();
  thread_ = std::thread([this] { Run(); });
}

RingFrontEnd::~RingFrontEnd() {
  Stop();
  munmap(base_, layout_.total_bytes);
}

void RingFrontEnd::Stop() {
  {
    base::MutexLock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  stop_ = true;
  control_->daemon_doorbell.RingAlways();
  if (thread_.joinable()) {
    thread_.join();
    metrics::Get().ring_threads->Decrement();
  }
  {
    base::MutexLock lock(mu_);  // no answer is read from here on: the waiting ones go
    metrics::Get().ring_completions_waiting->Decrement(static_cast<double>(queued_.size()));
    queued_.clear();
  }
  control_->state.closed.store(1, std::memory_order_seq_cst);
  control_->client_doorbell.RingAlways();
  ReleaseRing(ring_id_);  // another session may attach it from here on
}

void RingFrontEnd::Run() {
  int idle_wakes = 0;  // wake-ups in a row that found no work (a client ringing for nothing)
  bool rung = false;   // the last wait ended by a ring, not by its timeout
  double last_work_seconds = NowSeconds();
  for (;;) {
    std::string corrupt;
    {
      base::MutexLock lock(mu_);
      corrupt = corrupt_;
    }
    if (!corrupt.empty()) {
      end_(absl::InvalidArgumentError(absl::StrFormat(
          "the request ring's %s: the client corrupted its ring (a client must only advance "
          "its own indices, by the entries it wrote or took); the session has ended and its "
          "blocks and regions were released",
          corrupt)));
      return;
    }
    if (stop_) return;
    const size_t moved = FlushQueued();
    const int taken = TakeSubmissions();
    if (moved != 0 || taken != 0) {
      idle_wakes = 0;
      last_work_seconds = NowSeconds();
      continue;
    }
    // Rung with nothing to do, again and again: back off. A timed poll that found nothing is
    // no such wake-up: counted, it would put the thread to sleep for 1 ms, unarmed, every 64
    // polls, and an urgent reload rung meanwhile would wait for it.
    if (rung && ++idle_wakes > 64) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
      idle_wakes = 0;
      metrics::Get().ring_backoffs_total->Increment();
      base::MutexLock lock(mu_);
      ++counters_.backoffs;
    }
    rung = WaitForWork(last_work_seconds);
  }
}

int RingFrontEnd::TakeSubmissions() {
  {
    base::MutexLock lock(mu_);
    if (queued_.size() >= kMaxQueuedCompletions || !corrupt_.empty()) return 0;
  }
  int taken = 0;
  for (; taken < kTakeBatch && !stop_ && !intake_closed_; ++taken) {
    common::SubmissionEntry entry;  // the one copy of the slot the daemon reads
    const RingResult r = submissions_.TryPop(&entry);
    if (r == RingResult::kEmpty) break;
    if (r == RingResult::kCorrupt) {
      MarkCorrupt("submission tail is out of range (past the free slots, or behind the head)");
      break;
    }
    std::string why;
    if (!common::ValidateSubmission(entry, &why)) {
      {
        base::MutexLock lock(mu_);
        ++counters_.malformed;
      }
      metrics::Get().ring_malformed_entries_total->Increment();
      const session::Completion refused{
          .request_id = entry.request_id,
          .kind = session::CompletionKind::kError,
          .status = absl::InvalidArgumentError(why)};
      if (refused_) refused_(refused.status);
      Complete(refused);
      continue;
    }
    absl::Status ended = handle_(FromRing(entry));
    if (!ended.ok()) {  // the session has ended: answer this one, take no more
      intake_closed_ = true;
      Complete(session::Completion{.request_id = entry.request_id,
                                   .kind = session::CompletionKind::kError,
                                   .status = std::move(ended)});
    }
  }
  if (taken != 0) {
    control_->client_doorbell.Ring();  // slots freed for a client waiting on them
    metrics::Get().ring_requests_total->Increment(taken);
  }
  base::MutexLock lock(mu_);
  counters_.submissions += taken;
  return taken;
}

void RingFrontEnd::Complete(const session::Completion& completion) {
  const common::CompletionEntry entry = ToRing(completion);
  bool wake = false;
  {
    base::MutexLock lock(mu_);
    if (stopped_ || !corrupt_.empty()) return;  // nobody will read it
    if (queued_.empty()) {
      switch (completions_.TryPush(entry)) {
        case RingResult::kOk:
          ++counters_.completions;
          wake = true;
          break;
        case RingResult::kCorrupt:
          corrupt_ = "completion head is out of range (past the tail, or moved backwards)";
          break;
        default:
          queued_.push_back(entry);
          metrics::Get().ring_completions_waiting->Increment();
      }
    } else {
      queued_.push_back(entry);
      metrics::Get().ring_completions_waiting->Increment();
    }
    if (queued_.size() > counters_.queued_peak) counters_.queued_peak = queued_.size();
  }
  if (wake) control_->client_doorbell.Ring();
  if (!wake) control_->daemon_doorbell.Ring();  // the ring thread flushes or ends the session
}

size_t RingFrontEnd::FlushQueued() {
  size_t moved = 0;
  {
    base::MutexLock lock(mu_);
    while (!queued_.empty() && corrupt_.empty()) {
      const RingResult r = completions_.TryPush(queued_.front());
      if (r == RingResult::kCorrupt) {
        corrupt_ = "completion head is out of range (past the tail, or moved backwards)";
      }
      if (r != RingResult::kOk) break;
      queued_.pop_front();
      ++moved;
    }
    counters_.completions += moved;
    if (moved != 0) metrics::Get().ring_completions_waiting->Decrement(static_cast<double>(moved));
  }
  if (moved != 0) control_->client_doorbell.Ring();
  return moved;
}

bool RingFrontEnd::WorkReady() {
  if (stop_) return true;
  {
    base::MutexLock lock(mu_);
    if (!corrupt_.empty()) return true;
    if (!queued_.empty() && (completions_.Free() != 0 || completions_.Corrupt())) return true;
    if (queued_.size() >= kMaxQueuedCompletions) return false;  // paused: submissions wait
  }
  return !intake_closed_ && submissions_.Available() != RingResult::kEmpty;
}

bool RingFrontEnd::WaitForWork(double last_work_seconds) {
  const double now = NowSeconds();
  const double spin_until = now + waiting_.spin_seconds;
  while (NowSeconds() < spin_until) {
    if (WorkReady()) return true;
    // Polling must not keep a client that shares this core from running (its submission is
    // what the poll waits for): give the core up between polls.
    sched_yield();
  }
  // Advertised before the re-check below (common/ring_format.h "Deferred wake-ups"): a client
  // that still read the old interval published before that re-check.
  const bool polling = waiting_.poll_seconds > 0 &&
                       now - last_work_seconds < common::kRingPollWindowSeconds;
  const auto poll_us = static_cast<uint32_t>(std::max(1.0, waiting_.poll_seconds * 1e6));
  control_->state.poll_microseconds.store(polling ? poll_us : 0, std::memory_order_seq_cst);
  const uint32_t seen = control_->daemon_doorbell.Arm();
  bool rung = true;
  if (!WorkReady()) {
    {
      base::MutexLock lock(mu_);
      ++counters_.sleeps;
      if (polling) ++counters_.polls;
    }
    (polling ? metrics::Get().ring_sleeps_poll_total : metrics::Get().ring_sleeps_doorbell_total)
        ->Increment();
    control_->daemon_doorbell.Sleep(seen, polling ? waiting_.poll_seconds : 1.0);
    rung = control_->daemon_doorbell.bell.load(std::memory_order_seq_cst) != seen;
  }
  control_->daemon_doorbell.Disarm();
  return rung;
}

void RingFrontEnd::MarkCorrupt(const std::string& what) {
  base::MutexLock lock(mu_);
  if (corrupt_.empty()) corrupt_ = what;
}

RingFrontEnd::Counters RingFrontEnd::counters() const {
  base::MutexLock lock(mu_);
  return counters_;
}

}  // namespace offloadd::rpc
