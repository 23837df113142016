// Attacks on the simulated client GPU path of a root daemon (--backend=cuda-sim), each run by
// attack_client (attack_client.cc) as uid 65534 against a daemon started by this test (root):
//  - forged handles naming another uid's table (this test process is the victim): refused, and
//    the victim's memory and events are untouched;
//  - a table rewritten under a waiting offload: the daemon keeps serving (it used to SIGSEGV);
//  - tables of exited and of killed clients: no longer mapped in the daemon once their
//    session ended.
// Skipped where this test cannot setuid (not root, or a user-namespace sandbox).
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "client/offloadd_client.h"
#include "client/sim_client_cuda_api.h"
#include "common/base/clock.h"
#include "common/sim_gpu_table.h"
#include "gtest/gtest.h"
#include "tests/e2e/child_process.h"

namespace offloadd::testing {
namespace {

constexpr uint64_t kBytes = 4ull << 20;
constexpr int kPermissionDenied = 7;

std::map<std::string, std::string> ReadPairs(ChildProcess& c) {
  std::map<std::string, std::string> kv;
  for (std::string line; !(line = c.ReadLine()).empty();) {
    if (line.back() == '\n') line.pop_back();
    const size_t space = line.find(' ');
    kv[line.substr(0, space)] = space == std::string::npos ? "" : line.substr(space + 1);
  }
  return kv;
}

// Lines of /proc/<pid>/maps naming `needle`.
int MapsNaming(pid_t pid, const std::string& needle) {
  std::ifstream maps("/proc/" + std::to_string(pid) + "/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);) n += line.find(needle) != std::string::npos;
  return n;
}

class SimGpuAttacksTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root: the daemon is root, the attacker uid 65534";
    dir_ = "/tmp/ofd-attacks-XXXXXX";
    ASSERT_NE(mkdtemp(dir_.data()), nullptr);
    ASSERT_EQ(chmod(dir_.c_str(), 0755), 0);
    socket_ = dir_ + "/d.sock";
    daemon_ = SpawnChild({Runfile("server/offloadd"), "--socket_path=" + socket_,
                          "--socket_mode=0666", "--pool_bytes=128MiB", "--metrics_address=",
                          "--backend=cuda-sim"});
    ASSERT_NE(daemon_.ReadLine().find("ready"), std::string::npos) << "daemon did not start";
  }
  void TearDown() override {
    if (daemon_.pid > 0) {
      daemon_.Signal(SIGTERM);
      daemon_.Wait();
    }
    if (!dir_.empty() && dir_.back() != 'X') rmdir(dir_.c_str());
  }

  // attack_client with `args`; its output pairs once it exited (skips when it could not setuid).
  std::map<std::string, std::string> Attack(std::vector<std::string> args, int* exit_code) {
    args.insert(args.begin(), {Runfile("tests/attacks/attack_client"), "--socket=" + socket_,
                               "--uid=65534", "--bytes=" + std::to_string(kBytes)});
    ChildProcess c = SpawnChild(args);
    auto kv = ReadPairs(c);
    *exit_code = c.Wait();
    shm_unlink(common::SimTableName(c.pid).c_str());  // left by a client that did not finish
    return kv;
  }

  bool DaemonAlive() {
    int status = 0;
    return daemon_.pid > 0 && waitpid(daemon_.pid, &status, WNOHANG) == 0;
  }

  // A client of the daemon as this process (root): an offload and a reload of its own memory.
  void ExpectDaemonServes() {
    ASSERT_TRUE(DaemonAlive()) << "the daemon died";
    client::ClientOptions o;
    o.socket_path = socket_;
    o.client_name = "attacks-check";
    o.device_id = "check";
    auto c = client::Client::Connect(o);
    ASSERT_TRUE(c.ok()) << c.status();
    auto stats = (*c)->GetStats();
    EXPECT_TRUE(stats.ok()) << stats.status();
    (*c)->Close();
  }

  std::string dir_, socket_;
  ChildProcess daemon_;
};

TEST_F(SimGpuAttacksTest, ForgedHandlesOfAnotherUidsTableAreRefused) {
  // The victim: this process (uid 0), a table of mode 0600, a segment and a pending event.
  shm_unlink(common::SimTableName(getpid()).c_str());
  client::SimClientGpuOptions o;
  o.device_bytes = 16ull << 20;
  auto made = client::SimClientGpu::Create(o);
  ASSERT_TRUE(made.ok()) << made.status();
  auto victim = *made;
  uint64_t ptr = 0;
  std::string mem, ev_handle;
  void* stream = nullptr;
  void* event = nullptr;
  ASSERT_EQ(victim->SetDevice(0), 0);
  ASSERT_EQ(victim->Malloc(&ptr, kBytes), 0);
  ASSERT_EQ(victim->IpcGetMemHandle(ptr, &mem), 0);
  ASSERT_EQ(victim->StreamCreate(&stream), 0);
  ASSERT_EQ(victim->EventCreateIpc(&event), 0);
  ASSERT_EQ(victim->LaunchKernel(stream, 3600), 0);  // its event completes in an hour
  ASSERT_EQ(victim->EventRecord(event, stream), 0);
  ASSERT_EQ(victim->IpcGetEventHandle(event, &ev_handle), 0);
  std::memset(victim->HostBytes(ptr), 0xc3, kBytes);
  common::SimMemRef mref;
  common::SimEventRef eref;
  ASSERT_TRUE(common::ParseSimMemHandle(mem, &mref));
  ASSERT_TRUE(common::ParseSimEventHandle(ev_handle, &eref));
  const int64_t complete_at = victim->EventCompleteAtNanoseconds(event);
  const uint64_t seq = victim->EventSeq(event);

  int code = 0;
  auto kv = Attack({"--mode=forge", "--victim_pid=" + std::to_string(getpid()),
                    "--victim_generation=" + std::to_string(mref.generation),
                    "--victim_instance=" + std::to_string(mref.instance),
                    "--victim_event_slot=" + std::to_string(eref.slot)},
                   &code);
  if (kv.count("setuid_failed")) GTEST_SKIP() << "setuid(65534) failed (user namespace?)";
  EXPECT_EQ(code, 0) << kv["error"];
  EXPECT_EQ(kv["register_own_code"], "0") << kv["register_own_code_message"];
  EXPECT_EQ(kv["offload_own_code"], "0") << kv["offload_own_code_message"];
  for (const char* key : {"register_zero_code", "register_code", "done_zero_code", "done_code",
                          "ready_code"}) {
    EXPECT_EQ(kv[key], std::to_string(kPermissionDenied))
        << key << ": " << kv[std::string(key) + "_message"];
  }
  EXPECT_EQ(kv.count("offload_code"), 0u) << "a forged region registered and was read";
  EXPECT_EQ(kv.count("reload_code"), 0u) << "a forged region registered and was written";
  uint64_t changed = 0;  // victim bytes no longer what it wrote
  for (uint64_t i = 0; i < kBytes; ++i) changed += victim->HostBytes(ptr)[i] != 0xc3;
  EXPECT_EQ(changed, 0u);
  EXPECT_EQ(victim->EventCompleteAtNanoseconds(event), complete_at);
  EXPECT_EQ(victim->EventSeq(event), seq);
  ExpectDaemonServes();
}

TEST_F(SimGpuAttacksTest, TableRewrittenUnderAWaitingOffloadDoesNotCrashTheDaemon) {
  int code = 0;
  auto kv = Attack({"--mode=rewrite"}, &code);
  if (kv.count("setuid_failed")) GTEST_SKIP() << "setuid(65534) failed (user namespace?)";
  EXPECT_EQ(kv["register_own_code"], "0") << kv["register_own_code_message"];
  EXPECT_EQ(kv["done"], "1") << "the attacker did not finish: " << kv["error"];
  // The daemon copied from where the segment was when it opened it: its own copy of the
  // layout, not the rewritten one.
  EXPECT_EQ(kv["offload_code"], "0") << kv["offload_code_message"];
  // The reload finds the segment still mapped (it writes where the segment was when opened)
  // or opens it again, finds it outside the table and is refused: either way no address comes
  // from the rewritten fields.
  if (kv["reload_code"] != "0") {
    EXPECT_EQ(kv["reload_code"], "9") << kv["reload_code_message"];  // FAILED_PRECONDITION
    EXPECT_NE(kv["reload_code_message"].find("not live"), std::string::npos)
        << kv["reload_code_message"];
  }
  ExpectDaemonServes();
}

TEST_F(SimGpuAttacksTest, TableTruncatedUnderAWaitingOffloadDoesNotCrashTheDaemon) {
  int code = 0;
  auto kv = Attack({"--mode=truncate"}, &code);
  if (kv.count("setuid_failed")) GTEST_SKIP() << "setuid(65534) failed (user namespace?)";
  EXPECT_EQ(kv["register_own_code"], "0") << kv["register_own_code_message"];
  EXPECT_EQ(kv["done"], "1") << "the attacker did not finish: " << kv["error"];
  // The table reads as zeros from then on: the ready event complete, the segment free, so the
  // copy fails as one on freed memory.
  EXPECT_NE(kv["offload_code"], "0");
  EXPECT_NE(kv["offload_code"], "14") << "UNAVAILABLE: the daemon went away";
  ExpectDaemonServes();
}

// Runs the events client as uid 65534, lets it exit cleanly (SIGTERM: it closes its session and
// removes its table) or kills it, and expects its table unmapped from the daemon.
void ExpectTableReleased(pid_t daemon, const std::string& socket, bool kill_it) {
  ChildProcess c = SpawnChild({Runfile("tests/attacks/attack_client"), "--socket=" + socket,
                               "--uid=65534", "--bytes=" + std::to_string(kBytes),
                               "--mode=events"});
  std::string line, out;
  while (!(line = c.ReadLine()).empty() && line.rfind("ready", 0) != 0) out += line;
  if (out.find("setuid_failed") != std::string::npos) {
    c.Wait();
    GTEST_SKIP() << "setuid(65534) failed (user namespace?)";
  }
  const std::string name = common::SimTableName(c.pid);  // "/ofd-simgpu-<pid>"
  if (line.rfind("ready", 0) != 0) {
    c.Signal(SIGKILL);
    c.Wait();
    shm_unlink(name.c_str());
    FAIL() << "the client did not get through its transfers: " << out;
  }
  EXPECT_NE(out.find("offload_code 0"), std::string::npos) << out;
  EXPECT_NE(out.find("reload_code 0"), std::string::npos) << out;
  c.Signal(kill_it ? SIGKILL : SIGTERM);
  EXPECT_EQ(c.Wait(), kill_it ? 128 + SIGKILL : 0);
  shm_unlink(name.c_str());  // (a killed client leaves it)
  EXPECT_TRUE(base::PollUntil([&] { return MapsNaming(daemon, name) == 0; }, 20, 0.05))
      << name << " is still mapped in the daemon after its client "
      << (kill_it ? "was killed" : "exited");
}

TEST_F(SimGpuAttacksTest, TableOfAnExitedClientIsReleased) {
  ExpectTableReleased(daemon_.pid, socket_, /*kill_it=*/false);
  ExpectDaemonServes();
}

TEST_F(SimGpuAttacksTest, TableOfAKilledClientIsReleased) {
  ExpectTableReleased(daemon_.pid, socket_, /*kill_it=*/true);
  ExpectDaemonServes();
}

}  // namespace
}  // namespace offloadd::testing
