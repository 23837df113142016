// Isolation and failure handling through the real gRPC server (in-process daemon) and client
// processes (fault_client): sessions bound to the connection's credentials, Hello with another
// pid, the admin EndSession RPC, what a non-admin user sees and may do, the socket mode as the
// first gate, and a session whose process died while a child kept its stream open.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "client/offloadd_client.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/offload.grpc.pb.h"
#include "server/metrics/metrics.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/daemon_fixture.h"

namespace offloadd::testing {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// The daemon of these tests (tests/e2e/daemon_fixture.h): 32 MiB pool, 1 MiB chunks, and the
// socket mode given.
class Daemon : public InProcessDaemon {
 public:
  Daemon(session::CoreOptions o, uint32_t socket_mode)
      : InProcessDaemon(32 * kMiB, WithMiBChunks(std::move(o)), "faults", socket_mode) {}
  const std::string& path() const { return socket_path(); }
  std::unique_ptr<v1::Offload::Stub> Stub() {
    return v1::Offload::NewStub(
        grpc::CreateChannel("unix:" + path(), grpc::InsecureChannelCredentials()));
  }

 private:
  static session::CoreOptions WithMiBChunks(session::CoreOptions o) {
    o.chunk_bytes = kMiB;
    return o;
  }
};

bool WaitFor(const std::function<bool()>& pred) { return InProcessDaemon::WaitFor(pred, 15); }

double Ended(const std::string& cause) {
  return metrics::Get().sessions_ended_total->Add({{"cause", cause}}).Value();
}

// "key value" lines a fault_client prints, until it closes stdout.
std::map<std::string, std::string> ReadPairs(ChildProcess& c) {
  std::map<std::string, std::string> kv;
  for (std::string line; !(line = c.ReadLine()).empty();) {
    std::istringstream in(line);
    std::string k, v;
    in >> k;
    std::getline(in, v);
    kv[k] = v.empty() ? v : v.substr(1);
  }
  return kv;
}

// A fault_client process (tests/faults/fault_client.cc) with `args`, its stdout on a pipe.
ChildProcess Spawn(std::vector<std::string> args) {
  args.insert(args.begin(), Runfile("tests/faults/fault_client"));
  return SpawnChild(args);
}

TEST(FaultsTest, SessionIsBoundToTheConnectionsCredentials) {
  Daemon d({}, 0660);
  auto c = d.Connect();
  auto stats = c->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->sessions_size(), 1);
  const v1::SessionStats& s = stats->sessions(0);
  EXPECT_TRUE(s.peer_known());
  EXPECT_EQ(s.pid(), static_cast<uint32_t>(getpid()));
  EXPECT_EQ(s.uid(), geteuid());
  EXPECT_EQ(s.gid(), getegid());
  EXPECT_FALSE(stats->sessions_filtered());  // this process is the daemon's uid: an admin
}

TEST(FaultsTest, HelloNamingAnotherPidIsPermissionDenied) {
  Daemon d({}, 0660);
  auto stub = d.Stub();
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::ClientMessage m;
  v1::Request* r = m.add_requests();
  r->set_request_id(1);
  r->mutable_hello()->set_device_id("gpu0");
  r->mutable_hello()->set_pid(getpid() + 100000);
  ASSERT_TRUE(stream->Write(m));
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_EQ(reply.responses_size(), 1);
  EXPECT_EQ(reply.responses(0).error().code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_NE(reply.responses(0).error().message().find("belongs to pid"), std::string::npos);
  // The same stream may then say hello with its own pid.
  r->set_request_id(2);
  r->mutable_hello()->set_pid(getpid());
  ASSERT_TRUE(stream->Write(m));
  ASSERT_TRUE(stream->Read(&reply));
  EXPECT_TRUE(reply.responses(0).has_hello());
  stream->WritesDone();
  stream->Finish();
}

TEST(FaultsTest, AdminEndSessionReleasesBlocksAndTheClientSeesWhy) {
  Daemon d({}, 0660);
  auto victim = d.Connect("gpu-victim");
  auto region = client::ShmRegion::Create(4 * kMiB);
  ASSERT_TRUE(region.ok());
  auto rid = victim->RegisterShmRegion(*region);
  ASSERT_TRUE(rid.ok());
  auto off = victim->Offload(*rid, 0, 3 * kMiB).get();
  ASSERT_TRUE(off.ok()) << off.status();
  const double before = Ended("admin");

  auto stub = d.Stub();
  grpc::ClientContext ctx;
  v1::EndSessionRequest req;
  req.set_session_id(victim->session_id());
  req.set_reason("maintenance test");
  v1::EndSessionReply reply;
  // Without force a session holding a block is not ended, and says what it holds.
  grpc::Status st = stub->EndSession(&ctx, req, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("holds 1 blocks"), std::string::npos) << st.error_message();
  EXPECT_EQ(d.core().Stats().sessions_open, 1u);
  req.set_force(true);
  grpc::ClientContext ctx_force;
  st = stub->EndSession(&ctx_force, req, &reply);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(reply.session().blocks(), 1u);
  EXPECT_GE(reply.session().used_bytes(), 3 * kMiB);
  EXPECT_EQ(Ended("admin"), before + 1);
  EXPECT_EQ(d.core().store().stats().pool.used_bytes, 0u);
  // The victim's stream ends; its next request fails and the message carries the reason.
  ASSERT_TRUE(WaitFor([&] { return !victim->stream_status().ok(); }));
  auto again = victim->Offload(*rid, 0, kMiB).get();
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(victim->stream_status().message().find("maintenance test"), std::string::npos)
      << victim->stream_status();
  EXPECT_NE(victim->stream_status().message().find("ABORTED"), std::string::npos);

  grpc::ClientContext ctx2;
  st = stub->EndSession(&ctx2, req, &reply);  // no longer open
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST(FaultsTest, NonAdminUserSeesOnlyItsSessionsAndCannotEndOthers) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  Daemon open({}, 0666);
  auto root_client = open.Connect("gpu-root");
  ChildProcess user = Spawn({"--mode=user", "--socket=" + open.path(), "--uid=65534",
                      "--end_session=" + std::to_string(root_client->session_id())});
  auto kv = ReadPairs(user);
  EXPECT_EQ(user.Wait(), kv.count("setuid_failed") ? 1 : 0);
  if (kv.count("setuid_failed")) GTEST_SKIP() << "setuid(65534) failed (user namespace sandbox?)";
  EXPECT_EQ(kv["connect"], "0") << kv["connect_message"];
  EXPECT_EQ(kv["stats_sessions"], "1");  // its own; root's session is hidden
  EXPECT_EQ(kv["stats_filtered"], "1");
  EXPECT_EQ(kv["end_session"], std::to_string(grpc::StatusCode::PERMISSION_DENIED));
  EXPECT_TRUE(root_client->stream_status().ok());  // untouched

  // The socket mode is the first gate: 0660 root:root keeps uid 65534 out entirely, and the
  // client says so at once (PERMISSION_DENIED naming the socket and its group), not after the
  // connect timeout as an unavailable daemon.
  Daemon closed({}, 0660);
  const auto gate_start = std::chrono::steady_clock::now();
  ChildProcess gated = Spawn({"--mode=user", "--socket=" + closed.path(), "--uid=65534"});
  kv = ReadPairs(gated);
  gated.Wait();
  EXPECT_EQ(kv["connect"], std::to_string(static_cast<int>(absl::StatusCode::kPermissionDenied)));
  EXPECT_NE(kv["connect_message"].find("the socket " + closed.path()), std::string::npos)
      << kv["connect_message"];
  // root:root is the group no user should join: the advice is a dedicated socket_group.
  EXPECT_NE(kv["connect_message"].find("--socket_group=offloadd"), std::string::npos)
      << kv["connect_message"];
  EXPECT_EQ(kv["connect_message"].find("usermod -aG root"), std::string::npos)
      << kv["connect_message"];
  EXPECT_LT(std::chrono::steady_clock::now() - gate_start, std::chrono::seconds(3));

  // allowed_uids: connecting works, Hello is refused with a sentence naming the config field.
  session::CoreOptions o;
  o.access.allowed_uids = {0};
  Daemon restricted(o, 0666);
  ChildProcess denied = Spawn({"--mode=user", "--socket=" + restricted.path(), "--uid=65534"});
  kv = ReadPairs(denied);
  denied.Wait();
  EXPECT_EQ(kv["connect"], std::to_string(static_cast<int>(absl::StatusCode::kPermissionDenied)));
  EXPECT_NE(kv["connect_message"].find("allowed_uids"), std::string::npos);
}

TEST(FaultsTest, DeadProcessWhoseChildKeepsTheStreamOpenIsReleased) {
  session::CoreOptions o;
  o.pid_exit_grace_seconds = 0.2;
  Daemon d(o, 0660);
  const double pid_exited = Ended("pid_exited"), crashed = Ended("crashed");
  ChildProcess linger = Spawn({"--mode=linger", "--socket=" + d.path()});
  std::istringstream ready(linger.ReadLine());
  std::string word;
  uint64_t session_id = 0;
  pid_t grandchild = 0;
  ready >> word >> session_id >> grandchild;
  ASSERT_EQ(word, "ready");
  ASSERT_GT(grandchild, 0);
  EXPECT_GE(d.core().store().stats().pool.used_bytes, kMiB);
  EXPECT_EQ(d.core().pids_watched(), 1u);
  kill(linger.pid, SIGKILL);
  // Wait() drops the name of its shm region (never unlinked: SIGKILL), which stays mapped in
  // the grandchild.
  linger.Wait();
  // The grandchild still holds the connection: no stream break, only the pid is gone.
  EXPECT_TRUE(WaitFor([&] { return d.core().store().stats().pool.used_bytes == 0; }))
      << "the dead process's block was not released";
  EXPECT_TRUE(WaitFor([&] { return d.core().Stats().sessions.empty(); }));
  EXPECT_EQ(Ended("pid_exited"), pid_exited + 1);
  EXPECT_EQ(Ended("crashed"), crashed);
  kill(grandchild, SIGKILL);  // not our child: init reaps it
}

}  // namespace
}  // namespace offloadd::testing
