#include "server/session/transfer_gate.h"

#include <chrono>

namespace offloadd::session {

bool TransferGate::Begin() {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_) return false;
  ++in_flight_;
  return true;
}

void TransferGate::End() {
  std::lock_guard<std::mutex> lock(mu_);
  if (--in_flight_ == 0) idle_cv_.notify_all();
}

void TransferGate::StopAccepting() {
  std::lock_guard<std::mutex> lock(mu_);
  stopped_ = true;
}

bool TransferGate::WaitIdle(double seconds) {
  const double deadline_seconds = clock_->NowSeconds() + seconds;
  std::unique_lock<std::mutex> lock(mu_);
  while (in_flight_ != 0) {
    if (clock_->NowSeconds() >= deadline_seconds) return false;
    clock_->WaitUntil(lock, idle_cv_, deadline_seconds);
  }
  return true;
}

void TransferGate::WaitIdle() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_cv_.wait(lock, [this] { return in_flight_ == 0; });
}

uint64_t TransferGate::in_flight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

}  // namespace offloadd::session
