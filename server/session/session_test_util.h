// For tests of Session/Core without gRPC: a client's memory as a POSIX shm object, and the
// Hello/RegisterRegion requests a client opens with. Test-only (gtest expectations on setup).
#ifndef OFFLOADD_SERVER_SESSION_SESSION_TEST_UTIL_H_
#define OFFLOADD_SERVER_SESSION_SESSION_TEST_UTIL_H_

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/collectable.h"
#include "prometheus/labels.h"
#include "prometheus/metric_family.h"
#include "server/session/session.h"

namespace offloadd::session {

// "offloadd-<what>-<pid>-<random>": unique across concurrent tests (pids repeat across Bazel
// sandboxes, hence the random part).
inline std::string UniqueTestName(const std::string& what) {
  return "offloadd-" + what + "-" + std::to_string(getpid()) + "-" +
         std::to_string(std::random_device{}());
}

// Client memory: a new POSIX shm object of `size` bytes (zero-filled), mapped MAP_SHARED, so a
// forked child writes the same pages. Unmapped and unlinked on destruction.
struct TestShm {
  explicit TestShm(uint64_t size_bytes) : name("/" + UniqueTestName("shm")), size(size_bytes) {
    int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
    EXPECT_GE(fd, 0) << "shm_open " << name;
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(size)), 0);
    data = static_cast<uint8_t*>(mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
  }
  ~TestShm() {
    munmap(data, size);
    shm_unlink(name.c_str());
  }
  TestShm(const TestShm&) = delete;
  TestShm& operator=(const TestShm&) = delete;

  std::string name;  // "/offloadd-shm-..."
  uint64_t size;     // bytes
  uint8_t* data;
};

// A Hello from this process for device "gpu0"; `resume_token` empty = a new session.
inline Request HelloRequest(uint64_t request_id, const std::string& client_name,
                            const std::string& resume_token = "") {
  Request r;
  r.request_id = request_id;
  r.kind = RequestKind::kHello;
  r.client_name = client_name;
  r.device_id = "gpu0";
  r.pid = getpid();
  r.resume_token = resume_token;
  return r;
}

// Registers all of `shm` as a region.
inline Request RegisterRequest(uint64_t request_id, const TestShm& shm) {
  Request r;
  r.request_id = request_id;
  r.kind = RequestKind::kRegisterRegion;
  r.region.shm_name = shm.name;
  r.region.size_bytes = shm.size;
  return r;
}

// The value of the series of family `name` with exactly `labels` in one collection of
// `collectable` (a counter's or gauge's value); nullopt when there is no such series.
inline std::optional<double> ScrapedValue(const prometheus::Collectable& collectable,
                                          const std::string& name,
                                          const prometheus::Labels& labels) {
  for (const prometheus::MetricFamily& family : collectable.Collect()) {
    if (family.name != name) continue;
    for (const prometheus::ClientMetric& metric : family.metric) {
      prometheus::Labels got;
      for (const auto& label : metric.label) got[label.name] = label.value;
      if (got != labels) continue;
      return family.type == prometheus::MetricType::Counter ? metric.counter.value
                                                            : metric.gauge.value;
    }
  }
  return std::nullopt;
}

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_SESSION_TEST_UTIL_H_
