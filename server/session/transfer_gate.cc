#include "server/session/transfer_gate.h"

namespace offloadd::session {

bool TransferGate::Begin() {
  base::MutexLock lock(mu_);
  if (stopped_) return false;
  ++in_flight_;
  return true;
}

void TransferGate::End() {
  base::MutexLock lock(mu_);
  if (--in_flight_ == 0) idle_cv_.notify_all();
}

void TransferGate::StopAccepting() {
  base::MutexLock lock(mu_);
  stopped_ = true;
}

bool TransferGate::WaitIdle(double seconds) {
  const double deadline_seconds = clock_->NowSeconds() + seconds;
  base::MutexLock lock(mu_);
  while (in_flight_ != 0) {
    if (clock_->NowSeconds() >= deadline_seconds) return false;
    clock_->WaitUntil(mu_, idle_cv_, deadline_seconds);
  }
  return true;
}

void TransferGate::WaitIdle() {
  base::MutexLock lock(mu_);
  while (in_flight_ != 0) idle_cv_.Wait(mu_);
}

uint64_t TransferGate::in_flight() const {
  base::MutexLock lock(mu_);
  return in_flight_;
}

}  // namespace offloadd::session
