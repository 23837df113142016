#include "server/rpc/stream_flow.h"

namespace offloadd::rpc {

bool StreamFlow::FinishAtOnce() {
  if (stream_ == Stream::kFinished) return false;
  read_ = Read::kClosed;
  stream_ = Stream::kFinished;
  return true;
}

void StreamFlow::ReadDone(bool ok) {
  if (ok) {
    read_ = Read::kHandling;
    return;
  }
  read_ = Read::kClosed;
  RequestFinish();
}

StreamFlow::AfterSlice StreamFlow::SliceDone(bool more, bool queue_full) {
  if (stream_ != Stream::kOpen) return AfterSlice::kStop;
  if (queue_full && write_ == Write::kInFlight) {
    read_ = Read::kPaused;
    return AfterSlice::kPause;
  }
  if (more) return AfterSlice::kNextSlice;
  read_ = Read::kReading;
  return AfterSlice::kStartRead;
}

bool StreamFlow::AcceptsAnswers() const {
  return write_ != Write::kBroken && stream_ != Stream::kFinished;
}

bool StreamFlow::AnswerQueued() { return write_ == Write::kIdle; }

bool StreamFlow::WriteDone(bool ok) {
  write_ = ok ? Write::kIdle : Write::kBroken;
  return !ok;
}

bool StreamFlow::ResumeAfterWrite(bool queue_below_limit) {
  if (read_ != Read::kPaused || stream_ != Stream::kOpen || !queue_below_limit) return false;
  read_ = Read::kHandling;
  return true;
}

StreamFlow::Route StreamFlow::RouteMessage(int requests, bool none_may_block) const {
  if (!none_may_block || requests > kMaxInlineRequests || worker_tasks_ > 0) return Route::kWorker;
  return Route::kInline;
}

void StreamFlow::RequestFinish() {
  if (stream_ == Stream::kOpen) stream_ = Stream::kFinishing;
}

bool StreamFlow::TakeFinish(bool queue_empty) {
  if (stream_ != Stream::kFinishing || write_ == Write::kInFlight || !queue_empty) return false;
  stream_ = Stream::kFinished;
  return true;
}

}  // namespace offloadd::rpc
