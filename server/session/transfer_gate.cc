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
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                           [this] { return in_flight_ == 0; });
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
