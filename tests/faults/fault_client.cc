// fault_client: client processes for tests/faults, each mode one situation the daemon must
// handle. Results are printed as "key value" lines on stdout.
//
//   --mode=linger --socket=S   connect, offload one 1 MiB block, fork a child that keeps the
//                              connection open (inherited descriptors) and sleeps, print
//                              "ready <session_id> <child_pid>", then sleep until killed. Killing
//                              this process leaves the stream open: only the pid is gone.
//   --mode=hold --socket=S     connect, offload one 1 MiB block, print "ready <session_id>", wait
//                              until the daemon ends the stream, print "ended <status>", exit 0.
//   SIGTERM or SIGINT ends linger and hold with exit 0, their region unlinked.
//   --mode=user --socket=S --uid=U [--end_session=ID]
//                              setuid(U) (needs root), then try to connect; print
//                              "connect <code>"; if connected: "stats_sessions <n>",
//                              "stats_filtered <0|1>", and with --end_session,
//                              "end_session <code>" (grpc status code of EndSession).
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>

#include "client/offloadd_client.h"
#include "grpcpp/grpcpp.h"
#include "proto/offload.grpc.pb.h"

namespace {

// Set by SIGTERM/SIGINT: hold and linger then return normally, so the region's destructor unlinks
// its name (a test's cleanup that kills them leaves nothing in /dev/shm).
volatile sig_atomic_t g_stop = 0;
void OnStop(int) { g_stop = 1; }

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def = "") {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return def;
}

int Linger(const std::string& socket) {
  offloadd::client::ClientOptions o;
  o.socket_path = socket;
  o.client_name = "fault_client linger";
  o.device_id = "gpu-linger";
  auto c = offloadd::client::Client::Connect(o);
  if (!c.ok()) {
    std::cout << "error " << c.status() << std::endl;
    return 1;
  }
  auto region = offloadd::client::ShmRegion::Create(1 << 20);
  if (!region.ok()) return 1;
  auto id = (*c)->RegisterShmRegion(*region);
  if (!id.ok()) return 1;
  auto off = (*c)->Offload(*id, 0, 1 << 20).get();
  if (!off.ok()) {
    std::cout << "error " << off.status() << std::endl;
    return 1;
  }
  pid_t child = fork();
  if (child == 0) {
    // Holds every inherited descriptor, the session's connection included; no gRPC here, and
    // no return into destructors that would: it lives until killed.
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    while (true) pause();
  }
  std::cout << "ready " << (*c)->session_id() << " " << child << std::endl;
  while (!g_stop) pause();
  return 0;
}

int Hold(const std::string& socket) {
  offloadd::client::ClientOptions o;
  o.socket_path = socket;
  o.client_name = "fault_client hold";
  o.device_id = "gpu-hold";
  auto c = offloadd::client::Client::Connect(o);
  if (!c.ok()) {
    std::cout << "error " << c.status() << std::endl;
    return 1;
  }
  auto region = offloadd::client::ShmRegion::Create(1 << 20);
  if (!region.ok()) return 1;
  auto id = (*c)->RegisterShmRegion(*region);
  if (!id.ok() || !(*c)->Offload(*id, 0, 1 << 20).get().ok()) return 1;
  std::cout << "ready " << (*c)->session_id() << std::endl;
  while (!g_stop && (*c)->stream_status().ok()) usleep(20000);
  if (g_stop) return 0;
  std::cout << "ended " << (*c)->stream_status() << std::endl;
  return 0;
}

int User(const std::string& socket, uid_t uid, const std::string& end_session) {
  if (setgid(uid) != 0 || setuid(uid) != 0) {
    std::cout << "setuid_failed 1" << std::endl;
    return 1;
  }
  offloadd::client::ClientOptions o;
  o.socket_path = socket;
  o.client_name = "fault_client user";
  o.device_id = "gpu-user";
  o.connect_timeout_seconds = 3;
  auto c = offloadd::client::Client::Connect(o);
  std::cout << "connect " << static_cast<int>(c.status().code()) << std::endl;
  if (!c.ok()) {
    std::cout << "connect_message " << c.status().message() << std::endl;
    return 0;
  }
  auto stats = (*c)->GetStats();
  if (stats.ok()) {
    std::cout << "stats_sessions " << stats->sessions_size() << std::endl;
    std::cout << "stats_filtered " << stats->sessions_filtered() << std::endl;
  }
  if (!end_session.empty()) {
    auto stub = offloadd::v1::Offload::NewStub(
        grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    offloadd::v1::EndSessionRequest req;
    req.set_session_id(std::strtoull(end_session.c_str(), nullptr, 10));
    offloadd::v1::EndSessionReply reply;
    grpc::Status st = stub->EndSession(&ctx, req, &reply);
    std::cout << "end_session " << static_cast<int>(st.error_code()) << std::endl;
  }
  (*c)->Close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  struct sigaction stop = {};
  stop.sa_handler = OnStop;
  stop.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &stop, nullptr);
  sigaction(SIGINT, &stop, nullptr);
  const std::string mode = Flag(argc, argv, "mode");
  const std::string socket = Flag(argc, argv, "socket");
  if (mode == "linger") return Linger(socket);
  if (mode == "hold") return Hold(socket);
  if (mode == "user") {
    return User(socket, static_cast<uid_t>(std::atoi(Flag(argc, argv, "uid", "65534").c_str())),
                Flag(argc, argv, "end_session"));
  }
  std::cerr
      << "usage: fault_client --mode=linger|hold|user --socket=PATH [--uid=U] [--end_session=ID]\n";
  return 2;
}
