// For end-to-end tests that run real binaries (the daemon, benchmark clients) as child
// processes: where Bazel put a binary, and a child whose stdout the test reads line by line.
#ifndef OFFLOADD_TESTS_E2E_CHILD_PROCESS_H_
#define OFFLOADD_TESTS_E2E_CHILD_PROCESS_H_

#include <glob.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"

extern char** environ;

namespace offloadd::testing {

// The runfile `path` (workspace-relative, e.g. "server/offloadd") of this test.
inline std::string Runfile(const std::string& path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  return std::string(srcdir ? srcdir : ".") + "/offloadd/" + path;
}

// A child process with its stdout on a pipe to the test. pid is -1 when the spawn failed.
struct ChildProcess {
  pid_t pid = -1;
  FILE* out = nullptr;

  // The next line of its stdout, newline included; "" at end of output.
  std::string ReadLine() {
    char buf[4096];
    return out != nullptr && fgets(buf, sizeof(buf), out) ? std::string(buf) : std::string();
  }
  // Everything it writes until it closes stdout.
  std::string ReadAll() {
    std::string s, line;
    while (!(line = ReadLine()).empty()) s += line;
    return s;
  }
  // Sends `sig` (nothing when the spawn failed).
  void Signal(int sig) {
    if (pid > 0) kill(pid, sig);
  }
  // Reaps it: its exit code, 128 + signal number when a signal ended it, -1 when never spawned.
  // A client killed by a signal, or one that exits without running its destructors, never
  // unlinks its shared-memory regions ("offloadd-<pid>-..."); whatever is left under its pid is
  // removed here, however it ended, so that no test leaves names behind in /dev/shm.
  int Wait() {
    int status = 0;
    const bool reaped = pid > 0 && waitpid(pid, &status, 0) == pid;
    if (out) fclose(out);
    out = nullptr;
    if (!reaped) return -1;
    RemoveRegionsOf(pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  // Unlinks /dev/shm/offloadd-<pid>-* (the names ShmRegion gives a process's regions).
  static void RemoveRegionsOf(pid_t dead) {
    glob_t g{};
    const std::string pattern = "/dev/shm/offloadd-" + std::to_string(dead) + "-*";
    if (glob(pattern.c_str(), 0, nullptr, &g) == 0) {
      for (size_t i = 0; i < g.gl_pathc; ++i) unlink(g.gl_pathv[i]);
    }
    globfree(&g);
  }
};

// Starts `args` (args[0]: the binary's path) with stdout on a pipe; a test failure when it cannot.
inline ChildProcess SpawnChild(const std::vector<std::string>& args) {
  ChildProcess c;
  int fds[2];
  EXPECT_EQ(pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int rc = posix_spawn(&c.pid, argv[0], &actions, nullptr, argv.data(), environ);
  EXPECT_EQ(rc, 0) << "posix_spawn " << args[0];
  if (rc != 0) c.pid = -1;
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  c.out = fdopen(fds[0], "r");
  return c;
}

}  // namespace offloadd::testing

#endif  // OFFLOADD_TESTS_E2E_CHILD_PROCESS_H_
