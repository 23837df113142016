// StreamFlow: the flow control of one session stream (rpc/server.cc's SessionReactor) as
// explicit states, without gRPC, so every transition is unit-tested (stream_flow_test.cc).
//
// Three sides, each with its own state:
//   read:   kReading (a read is outstanding) -> kHandling (the message's requests go to the
//           session, a slice at a time) -> kReading again, or kPaused (too many answers wait for
//           a client that does not read; resumed when a write completes) or kClosed (the client
//           half-closed, the stream broke, the message did not parse).
//   write:  kIdle <-> kInFlight (at most one write per stream); kBroken once a write failed
//           (answers are dropped from then on).
//   stream: kOpen -> kFinishing (finish requested: the read side closed or the daemon ended the
//           session; waits for the write in flight and the queued answers) -> kFinished
//           (Finish called, exactly once).
// Routing: a message read is handled either on the gRPC reaction that read it (kInline: every
// request of it is known not to block and no worker task of the stream is queued or running,
// so it cannot overtake one) or on a request worker (kWorker). The caller counts its worker
// tasks here (WorkerTaskPosted / WorkerTaskDone).
// The caller owns the answer queue and reports whether it is empty or full; each method says
// what the caller must do (start a read or a write, call Finish, drop the queue, handle more).
// Not thread-safe: the reactor calls it under its own mutex.
#ifndef OFFLOADD_SERVER_RPC_STREAM_FLOW_H_
#define OFFLOADD_SERVER_RPC_STREAM_FLOW_H_

namespace offloadd::rpc {

class StreamFlow {
 public:
  enum class Read { kReading, kHandling, kPaused, kClosed };
  enum class Write { kIdle, kInFlight, kBroken };
  enum class Stream { kOpen, kFinishing, kFinished };

  // What to do after a slice of a message's requests was handed to the session.
  enum class AfterSlice {
    kStop,        // the stream is finishing: read no more
    kPause,       // wait for the write in flight (ResumeAfterWrite says when to go on)
    kNextSlice,   // hand the next slice of this message
    kStartRead,   // the message is done: start the next read (read is kReading again)
  };

  // Where a message read is handled (see the routing note above).
  enum class Route { kInline, kWorker };
  // Messages of more requests than this go to a worker even when none blocks, so a large
  // batch does not hold a gRPC callback thread for long.
  static constexpr int kMaxInlineRequests = 64;

  Read read() const { return read_; }
  int worker_tasks() const { return worker_tasks_; }
  Write write() const { return write_; }
  Stream stream() const { return stream_; }

  // The first read starts (the session opened).
  void Start() { read_ = Read::kReading; }
  // The session could not open: Finish at once (returns true once).
  bool FinishAtOnce();

  // A read completed. ok: a message to handle (kHandling). Not ok: the client half-closed or
  // the stream broke: kClosed, and finishing is requested.
  void ReadDone(bool ok);
  // The message read did not parse: kClosed (the session ends, which requests finishing).
  void ReadFailed() { read_ = Read::kClosed; }
  // After a slice: `more` requests of the message are left; `queue_full`: the answers waiting
  // reach the bound.
  AfterSlice SliceDone(bool more, bool queue_full);

  // Whether an answer may be queued (not once the write side broke or the stream finished).
  bool AcceptsAnswers() const;
  // An answer was queued: true when the caller must start a write (none in flight).
  bool AnswerQueued();
  // A write completed; true when the caller must drop the queued answers (the write failed).
  bool WriteDone(bool ok);
  // The caller starts writing what is queued: kInFlight.
  void WriteStarted() { write_ = Write::kInFlight; }
  // After a write completed and the next one (if any) started: true when a paused read side
  // must go on (kHandling again); `queue_below_limit`: the answers waiting are under the bound.
  bool ResumeAfterWrite(bool queue_below_limit);

  // Where the message just read (read side kHandling) goes: kInline only when
  // `none_may_block` (every one of its `requests` is known not to block the thread),
  // requests <= kMaxInlineRequests and no worker task of this stream is queued or running.
  Route RouteMessage(int requests, bool none_may_block) const;
  // A task of this stream was posted to a request worker / returned.
  void WorkerTaskPosted() { ++worker_tasks_; }
  // Returns the number of the stream's worker tasks still queued or running.
  int WorkerTaskDone() { return --worker_tasks_; }

  // Finishing is requested (read side closed, or the daemon ended the session).
  void RequestFinish();
  // True once, when the caller must call Finish now: finishing was requested, no write is in
  // flight and `queue_empty`.
  bool TakeFinish(bool queue_empty);

 private:
  Read read_ = Read::kReading;
  Write write_ = Write::kIdle;
  Stream stream_ = Stream::kOpen;
  int worker_tasks_ = 0;  // queued or running on a request worker
};

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_STREAM_FLOW_H_
