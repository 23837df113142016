#include "client/socket_path.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd {
namespace client {
namespace {

TEST(SocketPathTest, RootUsesRunEvenWithXdg) {
  EXPECT_EQ(DefaultSocketPathFor(0, "/run/user/0"), "/run/offloadd/offloadd.sock");
  EXPECT_EQ(DefaultSocketPathFor(0, nullptr), "/run/offloadd/offloadd.sock");
}

TEST(SocketPathTest, UserWithXdgRuntimeDir) {
  EXPECT_EQ(DefaultSocketPathFor(1000, "/run/user/1000"), "/run/user/1000/offloadd/offloadd.sock");
}

TEST(SocketPathTest, UserWithoutXdgFallsBackToTmp) {
  EXPECT_EQ(DefaultSocketPathFor(1000, nullptr), "/tmp/offloadd-1000/offloadd.sock");
  EXPECT_EQ(DefaultSocketPathFor(1234, ""), "/tmp/offloadd-1234/offloadd.sock");
}

TEST(SocketPathTest, SystemWideDaemonDirectoryServesEveryUser) {
  EXPECT_EQ(DefaultSocketPathFor(1000, "/run/user/1000", true), "/run/offloadd/offloadd.sock");
  EXPECT_EQ(DefaultSocketPathFor(1234, nullptr, true), "/run/offloadd/offloadd.sock");
  EXPECT_EQ(DefaultSocketPathFor(1000, "/run/user/1000", false),
            "/run/user/1000/offloadd/offloadd.sock");
}

TEST(SocketPathTest, DefaultMatchesRuleForThisProcess) {
  EXPECT_EQ(DefaultSocketPath(), DefaultSocketPathFor(geteuid(), std::getenv("XDG_RUNTIME_DIR"),
                                                      SystemSocketDirectoryExists()));
}

TEST(SocketPathTest, FitsChecksSunPathLimit) {
  EXPECT_FALSE(SocketPathFits(""));
  EXPECT_TRUE(SocketPathFits(std::string(107, 'a')));
  EXPECT_FALSE(SocketPathFits(std::string(108, 'a')));
}

}  // namespace
}  // namespace client
}  // namespace offloadd

namespace offloadd::client {
namespace {

// A socket the user may not open is reported as a permission problem, not as
// "daemon stuck or stale socket".
TEST(UnreachableSocketReasonTest, TellsPermissionFromStaleAndStuck) {
  EXPECT_NE(UnreachableSocketReason("/nonexistent/x.sock", EACCES).find("permission denied"),
            std::string::npos);
  EXPECT_EQ(UnreachableSocketReason("/nonexistent/x.sock", EACCES).find("stuck"),
            std::string::npos);
  EXPECT_NE(UnreachableSocketReason("/nonexistent/x.sock", ECONNREFUSED).find("no daemon listens"),
            std::string::npos);
  EXPECT_NE(UnreachableSocketReason("/nonexistent/x.sock", 0).find("no offloadd answered"),
            std::string::npos);
  EXPECT_EQ(ProbeUnixSocket("/nonexistent/x.sock"), ENOENT);
}

TEST(UnreachableSocketReasonTest, PermissionNamesTheFileItsGroupAndTheRemedy) {
  char tmpl[] = "/tmp/ofd-sockperm-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string sock = std::string(tmpl) + "/offloadd.sock";
  { std::FILE* f = std::fopen(sock.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  // Group root gets other advice (tests below): as root, give the file another group where a
  // sandbox's user namespace allows it.
  gid_t gid = getegid();
  if (gid == 0 && chown(sock.c_str(), static_cast<uid_t>(-1), 2000) == 0) gid = 2000;
  ASSERT_EQ(chmod(sock.c_str(), 0660), 0);
  const std::string why = UnreachableSocketReason(sock, EACCES);
  EXPECT_NE(why.find("the socket " + sock + " (group " + GroupText(gid)), std::string::npos)
      << why;
  EXPECT_NE(why.find("mode 0660"), std::string::npos) << why;
  if (gid != 0) {
    EXPECT_NE(why.find("do not restart it"), std::string::npos) << why;
  }
  EXPECT_NE(why.find("usermod -aG"), std::string::npos) << why;
  EXPECT_NE(why.find("supplementalGroups"), std::string::npos) << why;
  unlink(sock.c_str());
  rmdir(tmpl);
}

// Group root is never the advice: a socket in gid 0 gets a dedicated group via socket_group.
TEST(UnreachableSocketReasonTest, GroupRootAdvisesADedicatedSocketGroup) {
  const std::string why = JoinGroupRemedy("root (gid 0)", "root", "0");
  EXPECT_EQ(why.find("usermod -aG root"), std::string::npos) << why;
  EXPECT_EQ(why.find("add this user to group root"), std::string::npos) << why;
  EXPECT_NE(why.find("socket_group: offloadd in the config"), std::string::npos) << why;
  EXPECT_NE(why.find("--socket_group=offloadd"), std::string::npos) << why;
  EXPECT_NE(why.find("usermod -aG offloadd USER"), std::string::npos) << why;
  // Nor is nogroup (gid 65534), the group of a daemon run as nobody.
  const std::string nogroup = JoinGroupRemedy("nogroup (gid 65534)", "nogroup", "65534");
  EXPECT_EQ(nogroup.find("usermod -aG nogroup"), std::string::npos) << nogroup;
  EXPECT_EQ(nogroup.find("add this user to group nogroup"), std::string::npos) << nogroup;
  EXPECT_NE(nogroup.find("its group is nogroup (gid 65534), and users must not be added"),
            std::string::npos) << nogroup;
  EXPECT_NE(nogroup.find("socket_group: offloadd in the config"), std::string::npos) << nogroup;
  // Any other group is still the one to join.
  const std::string other = JoinGroupRemedy("offloadd (gid 2000)", "offloadd", "2000");
  EXPECT_NE(other.find("add this user to group offloadd (gid 2000) (usermod -aG offloadd USER"),
            std::string::npos) << other;
  EXPECT_EQ(other.find("socket_group"), std::string::npos) << other;
}

// End to end through the file: a socket whose group is gid 0 (made so by chown when this test
// may; skipped otherwise).
TEST(UnreachableSocketReasonTest, SocketInGroupRootNamesSocketGroupNotRoot) {
  char tmpl[] = "/tmp/ofd-sockroot-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string sock = std::string(tmpl) + "/offloadd.sock";
  { std::FILE* f = std::fopen(sock.c_str(), "w"); ASSERT_NE(f, nullptr); std::fclose(f); }
  if (chown(sock.c_str(), static_cast<uid_t>(-1), 0) != 0) {
    unlink(sock.c_str());
    rmdir(tmpl);
    GTEST_SKIP() << "cannot give a file group 0 here";
  }
  ASSERT_EQ(chmod(sock.c_str(), 0660), 0);
  const std::string why = UnreachableSocketReason(sock, EACCES);
  EXPECT_NE(why.find("(group " + GroupText(0) + ", mode 0660)"), std::string::npos) << why;
  EXPECT_EQ(why.find("usermod -aG root"), std::string::npos) << why;
  EXPECT_EQ(why.find("usermod -aG 0 "), std::string::npos) << why;
  EXPECT_NE(why.find("--socket_group=offloadd"), std::string::npos) << why;
  unlink(sock.c_str());
  rmdir(tmpl);
}

}  // namespace
}  // namespace offloadd::client

namespace offloadd::client {
namespace {

struct stat ModeOf(mode_t mode, uid_t owner, gid_t group, bool socket = true) {
  struct stat st {};
  st.st_mode = (socket ? S_IFSOCK : S_IFDIR) | mode;
  st.st_uid = owner;
  st.st_gid = group;
  return st;
}

// The mode's own words: an owner-only socket names its owner, not "admits only its group", and
// says so whether or not this process is in the socket's group.
TEST(ModeDenialReasonTest, OwnerOnlySocketNamesItsOwner) {
  const ProcessCredentials in_group{65534, {0}}, outside{65534, {65534}};
  const std::string member =
      ModeDenialReasonFor(ModeOf(0600, 0, 0), true, "root (gid 0)", in_group);
  EXPECT_EQ(member,
            "its mode gives its group root (gid 0), which this process (uid 65534, groups 0) is "
            "in, no write (w, which connecting needs) permission: only its owner, " +
                UserText(0) + ", may connect");
  const std::string other =
      ModeDenialReasonFor(ModeOf(0600, 0, 0), true, "root (gid 0)", outside);
  EXPECT_EQ(other,
            "its mode gives neither its group root (gid 0) nor other users write (w, which "
            "connecting needs) permission: only its owner, " + UserText(0) + ", may connect, and this process is uid 65534, "
            "groups 65534");
  // 0000 admits no user but root; 0755 gives its group r-x, no write.
  EXPECT_NE(ModeDenialReasonFor(ModeOf(0000, 0, 0), true, "g", outside)
                .find("no user but root may connect"), std::string::npos);
  EXPECT_NE(ModeDenialReasonFor(ModeOf(0755, 0, 0), true, "g", in_group)
                .find("is in, no write (w, which connecting needs) permission: only its owner"),
            std::string::npos);
  // The remedy is the daemon's socket mode and group, or running as the owner (root for 0000).
  const std::string remedy = ModeDenialRemedy(ModeOf(0600, 0, 0), true);
  EXPECT_NE(remedy.find("--socket_mode=0660 --socket_group=offloadd"), std::string::npos);
  EXPECT_NE(remedy.find("or run this as " + UserText(0)), std::string::npos) << remedy;
  EXPECT_NE(ModeDenialRemedy(ModeOf(0000, 1000, 0), true).find("or run this as root"),
            std::string::npos);
}

// Where the group's bits would admit this process, or its class has the permission, the mode is
// not the reason: "" (PermissionDeniedReason then names the group to join).
TEST(ModeDenialReasonTest, GroupThatAdmitsIsNotAModeProblem) {
  const ProcessCredentials outside{65534, {65534}}, member{1000, {1000, 2000}};
  EXPECT_EQ(ModeDenialReasonFor(ModeOf(0660, 0, 2000), true, "g", outside), "");
  EXPECT_EQ(ModeDenialReasonFor(ModeOf(0660, 0, 2000), true, "g", member), "");
  EXPECT_EQ(ModeDenialReasonFor(ModeOf(0600, 1000, 2000), true, "g", member), "");
  // A directory needs search (x): 0700 shuts its group out, 0750 admits it.
  EXPECT_NE(ModeDenialReasonFor(ModeOf(0700, 0, 2000, false), false, "g", member)
                .find("no search (x) permission: only its owner"), std::string::npos);
  EXPECT_EQ(ModeDenialReasonFor(ModeOf(0750, 0, 2000, false), false, "g", member), "");
}

// A Unix socket bound to `path` and listening with `backlog`; its descriptor, or -1.
int ListenAt(const std::string& path, int backlog) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(fd, backlog) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// A socket file with no listener behind it is told from a live one by the kernel's socket
// diagnostics, and the permission message then says no daemon listens instead of "the daemon
// is fine".
TEST(SocketListenerTest, StaleSocketFileIsNotListening) {
  char tmpl[] = "/tmp/ofd-listener-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/d.sock";
  const int fd = ListenAt(path, 1);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(chmod(path.c_str(), 0660), 0);
  EXPECT_EQ(SocketListenerAt(path), SocketListener::kListening);
  close(fd);  // the file stays: a daemon killed before it could unlink its socket
  EXPECT_EQ(SocketListenerAt(path), SocketListener::kNotListening);
  EXPECT_EQ(ProbeUnixSocket(path), ECONNREFUSED);
  const std::string why = UnreachableSocketReason(path, EACCES);
  EXPECT_EQ(why.find("daemon is fine"), std::string::npos) << why;
  EXPECT_EQ(why.find("do not restart it"), std::string::npos) << why;
  EXPECT_NE(why.find("No daemon listens on it"), std::string::npos) << why;
  EXPECT_EQ(SocketListenerAt(std::string(tmpl)), SocketListener::kUnknown);  // not a socket
  EXPECT_EQ(JoinGroupRemedy("offloadd (gid 2000)", "offloadd", "2000", false)
                .find("daemon is fine"), std::string::npos);
  EXPECT_EQ(JoinGroupRemedy("root (gid 0)", "root", "0", false).find("daemon is fine"),
            std::string::npos);
  unlink(path.c_str());
  rmdir(tmpl);
}

// A listener that accepts nothing (a stopped daemon) made the probe's blocking connect wait
// forever once its queue was full: offloadctl hung on such a socket.
TEST(ProbeUnixSocketTest, AListenerThatAcceptsNothingIsEagainNotAWait) {
  char tmpl[] = "/tmp/ofd-probe-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string path = std::string(tmpl) + "/d.sock";
  const int fd = ListenAt(path, 0);
  ASSERT_GE(fd, 0);
  std::vector<int> results;
  for (int i = 0; i < 4; ++i) results.push_back(ProbeUnixSocket(path));
  EXPECT_EQ(results.front(), 0);  // queued while the queue had room
  EXPECT_EQ(results.back(), EAGAIN);
  const std::string why = UnreachableSocketReason(path, EAGAIN);
  EXPECT_NE(why.find("accepts no connection"), std::string::npos) << why;
  EXPECT_EQ(ProbeUnixSocket(std::string(tmpl) + "/" + std::string(120, 'a')), ENAMETOOLONG);
  close(fd);
  unlink(path.c_str());
  rmdir(tmpl);
}

}  // namespace
}  // namespace offloadd::client
