// HostLink: the level above links — a CPU root port or a host memory (NUMA) node that several
// switch uplinks feed, with a capacity of its own that may be less than the sum of theirs.
//
// One HostLink per direction is shared by the LinkSchedulers of its child links (set
// LinkSchedulerOptions::parent). Before a child link starts a chunk it takes a *turn* here:
//   double start = host.WaitTurn(child);   // blocks until it is this child's turn and the
//                                          // level is free (virtual time, like LinkScheduler)
//   ... the child picks its chunk only now (late, so an urgent reload is not stuck behind it)
//   double finish = host.Commit(child, chunk_len);  // start + len / bytes_per_second
// Exactly one turn is outstanding at a time: the next is decided only when the previous one
// was committed and the level's virtual finish time has passed, so a child that has work
// waits at most until then to be counted (late decisions keep rounds fair).
//
// Fairness among children is surplus round robin (SRR; Adiseshu, Parulkar and Varghese, "A
// Reliable and Scalable Striping Protocol", SIGCOMM 1996): a DRR variant for packets whose
// size is known only after they are sent. A child in its turn keeps the turns while its
// deficit is > 0; each visit adds weight x quantum_bytes; a commit subtracts the bytes moved,
// so the deficit may go negative and the child then waits longer for its next turn. A child
// with no waiting chunk when the round reaches it leaves the round and its deficit (positive or
// negative) is dropped: idle children give their share away and bank nothing. Children that
// are held back by their own link's capacity simply wait less often here; the rest share what
// is left (max-min fairness across the two levels).
//
// TurnQueue is the turn order alone, deterministic and single-threaded (tests drive it).
// HostLink adds the clock, pacing and blocking; all its methods are thread-safe.
#ifndef OFFLOADD_SERVER_SCHED_HOST_LINK_H_
#define OFFLOADD_SERVER_SCHED_HOST_LINK_H_

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>

#include "common/base/mutex.h"
#include "server/sched/link_scheduler.h"

namespace offloadd::sched {

class TurnQueue {
 public:
  // quantum_bytes 0 is treated as 8 MiB; weights default to 1 (0 is treated as 1).
  TurnQueue(uint64_t quantum_bytes, std::map<std::string, uint32_t> weights);

  // `child` has one more chunk waiting for a turn.
  void Join(const std::string& child);
  // The child whose turn is next (one of its waiting chunks is taken), or nullopt when nobody
  // waits. The caller must Charge that child before calling Next again.
  std::optional<std::string> Next();
  // The turn Next gave `child` moved `bytes` (0: the turn went unused).
  void Charge(const std::string& child, uint64_t bytes);

  // For tests: the child's deficit (0 once it left the round) and waiting chunks.
  int64_t deficit_bytes(const std::string& child) const;
  uint64_t waiting(const std::string& child) const;

 private:
  struct Child {
    uint64_t waiting = 0;
    int64_t deficit_bytes = 0;
    bool in_turn = false;  // the quantum of the current visit was already added
  };
  int64_t Quantum(const std::string& child) const;

  uint64_t quantum_bytes_;
  std::map<std::string, uint32_t> weights_;
  std::map<std::string, Child> children_;  // those in the round
  std::deque<std::string> round_;          // round-robin order of children_
};

struct HostLinkOptions {
  std::string name;                               // e.g. "numa0", "host-0000:00:01.0"
  std::string direction;                          // "d2h" / "h2d" (or "both"), for stats
  double bytes_per_second = 0;                    // 0 = unpaced: turns only order, never wait
  uint64_t quantum_bytes = 8ull << 20;            // SRR quantum per weight unit
  std::map<std::string, uint32_t> child_weights;  // by child link name; default 1
};

struct HostLinkStats {
  uint64_t bytes = 0;
  std::map<std::string, uint64_t> child_bytes;  // by child link name
  // Seconds of this level's capacity used: sum of bytes / bytes_per_second (0 when unpaced).
  // busy_seconds / wall time is the level's utilisation.
  double busy_seconds = 0;
  uint64_t turns = 0;  // committed turns, unused ones included
};

class HostLink {
 public:
  explicit HostLink(HostLinkOptions options, Clock* clock = Clock::Real());

  // Blocks until `child` holds the turn and the level is free; returns the turn's start time
  // (Clock seconds, <= now). The caller must call Commit(child, ...) next, promptly: nobody
  // else gets a turn until it does. A child should wait for one turn at a time.
  double WaitTurn(const std::string& child) EXCLUDES(mu_);
  // Ends the turn: `bytes` were started in it (0: unused). Returns the time the level has
  // moved them (start + bytes / bytes_per_second; start when unpaced or for 0 bytes).
  double Commit(const std::string& child, uint64_t bytes) EXCLUDES(mu_);

  HostLinkStats stats() const EXCLUDES(mu_);
  const HostLinkOptions& options() const { return options_; }

 private:
  const HostLinkOptions options_;
  Clock* const clock_;

  mutable base::Mutex mu_;
  base::CondVar cv_;
  TurnQueue turns_ GUARDED_BY(mu_);
  bool granted_ GUARDED_BY(mu_) = false;  // a turn is outstanding (decided, not yet committed)
  bool taken_ GUARDED_BY(mu_) = false;    // ... and its child's waiter has returned from WaitTurn
  std::string granted_child_ GUARDED_BY(mu_);
  double grant_start_seconds_ GUARDED_BY(mu_) = 0;
  double free_at_seconds_ GUARDED_BY(mu_) = 0;  // virtual finish of the last committed bytes
  bool sleeper_ GUARDED_BY(mu_) = false;  // one waiter sleeps on the clock until free_at_seconds_
  uint64_t waiters_ GUARDED_BY(mu_) = 0;  // in WaitTurn, not yet holding a turn
  double backlog_since_seconds_ GUARDED_BY(mu_) = 0;  // when a child began to wait while none did
  HostLinkStats stats_ GUARDED_BY(mu_);
};

}  // namespace offloadd::sched

#endif  // OFFLOADD_SERVER_SCHED_HOST_LINK_H_
