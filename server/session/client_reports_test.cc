// Client reports: the increase between two reports, refusals, per-GPU sums, a session's latest
// report in its info and the Core's stats, and the audit lines of a session's life.
#include "server/session/client_reports.h"

#include <unistd.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>

#include "common/base/fake_clock.h"
#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"
#include "server/session/audit.h"
#include "server/session/completion_collector.h"
#include "server/session/session.h"
#include "server/session/session_test_util.h"

namespace offloadd::session {
namespace {

ClientCounters Counts(uint64_t fallbacks, uint64_t waits, double seconds, uint64_t idle) {
  ClientCounters c;
  c.fallbacks_total = fallbacks;
  c.host_waits_total = waits;
  c.host_wait_seconds_total = seconds;
  c.idle_steps_total = idle;
  return c;
}

TEST(ReportIncreaseTest, IsTheDifferenceOfTwoReports) {
  auto inc = ReportIncrease(Counts(2, 5, 1.5, 1), Counts(7, 5, 2.25, 4), 10);
  ASSERT_TRUE(inc.ok()) << inc.status();
  EXPECT_EQ(inc->fallbacks_total, 5u);
  EXPECT_EQ(inc->host_waits_total, 0u);
  EXPECT_DOUBLE_EQ(inc->host_wait_seconds_total, 0.75);
  EXPECT_EQ(inc->idle_steps_total, 3u);
}

TEST(ReportIncreaseTest, ACountGoingDownOrBadSecondsIsRefusedNamingTheField) {
  auto down = ReportIncrease(Counts(3, 0, 0, 0), Counts(2, 0, 0, 0), 10);
  EXPECT_EQ(down.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(down.status().message().find("fallbacks_total went down from 3 to 2"),
            std::string::npos)
      << down.status();
  auto idle = ReportIncrease(Counts(0, 0, 0, 9), Counts(0, 0, 0, 8), 10);
  EXPECT_NE(idle.status().message().find("idle_steps_total"), std::string::npos);
  for (double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity(), kMaxReportedSeconds * 2,
                     std::numeric_limits<double>::max()}) {
    auto st = ReportIncrease({}, Counts(0, 0, bad, 0), 10).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(st.message().find("host_wait_seconds_total"), std::string::npos) << st;
  }
}

// host_wait_seconds_total=1e12 and fallbacks_total=2^64-1 in one report saturated a GPU's sums
// for good, so its fallback and host-wait alerts could never fire again.
TEST(ReportIncreaseTest, AReportIsBoundedByTheSessionsAge) {
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  auto seconds = ReportIncrease({}, Counts(0, 0, kMaxReportedSeconds, 0), 10).status();
  EXPECT_EQ(seconds.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(seconds.message().find("host_wait_seconds_total is 1e+12 but this session began 10 s"),
            std::string::npos)
      << seconds;
  EXPECT_TRUE(ReportIncrease({}, Counts(0, 0, 11.0, 0), 10).ok());  // age + 1 s
  EXPECT_FALSE(ReportIncrease({}, Counts(0, 0, 11.5, 0), 10).ok());
  for (const ClientCounters& c : {Counts(max, 0, 0, 0), Counts(0, max, 0, 0), Counts(0, 0, 0, max),
                                  Counts(11000001, 0, 0, 0)}) {
    auto st = ReportIncrease({}, c, 10).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
    EXPECT_NE(st.message().find("a second since this session began 10 s ago"), std::string::npos)
        << st;
  }
  EXPECT_TRUE(ReportIncrease({}, Counts(11000000, 11000000, 0, 11000000), 10).ok());
  // A report too early stays refusable, and a later one with the same totals passes.
  EXPECT_FALSE(ReportIncrease({}, Counts(0, 0, 30, 0), 10).ok());
  EXPECT_TRUE(ReportIncrease({}, Counts(0, 0, 30, 0), 29).ok());
}

TEST(ClientReportsTest, SumsIncreasesByGpu) {
  ClientReports r;
  r.Add({"gpu0", "1000"}, Counts(1, 2, 0.5, 0));
  r.Add({"gpu1", "1000"}, Counts(4, 0, 0, 1));
  r.Add({"gpu0", "1000"}, Counts(2, 1, 0.25, 3));
  const auto by_gpu = r.ByGpu();
  ASSERT_EQ(by_gpu.size(), 2u);
  EXPECT_EQ(by_gpu.at("gpu0").fallbacks_total, 3u);
  EXPECT_EQ(by_gpu.at("gpu0").host_waits_total, 3u);
  EXPECT_DOUBLE_EQ(by_gpu.at("gpu0").host_wait_seconds_total, 0.75);
  EXPECT_EQ(by_gpu.at("gpu0").idle_steps_total, 3u);
  EXPECT_EQ(by_gpu.at("gpu1").fallbacks_total, 4u);
}

TEST(ClientReportsTest, EachUidKeepsItsOwnSeriesOfAGpuAndByGpuAddsThemUp) {
  ClientReports r;
  r.Add({"gpu0", "1000"}, Counts(1, 2, 0.5, 0));
  r.Add({"gpu0", "65534"}, Counts(7, 0, 30, 0));
  r.Add({"gpu0", "1000"}, Counts(2, 0, 0.25, 1));
  const auto by_series = r.BySeries();
  ASSERT_EQ(by_series.size(), 2u);
  const ClientCounters own = by_series.at({"gpu0", "1000"});
  EXPECT_EQ(own.fallbacks_total, 3u);
  EXPECT_DOUBLE_EQ(own.host_wait_seconds_total, 0.75);
  EXPECT_EQ(by_series.at({"gpu0", "65534"}).fallbacks_total, 7u);
  const ClientCounters sum = r.ByGpu().at("gpu0");
  EXPECT_EQ(sum.fallbacks_total, 10u);
  EXPECT_DOUBLE_EQ(sum.host_wait_seconds_total, 30.75);
  EXPECT_EQ(sum.idle_steps_total, 1u);
}

TEST(ClientReportsTest, SumsSaturateInsteadOfWrappingOrReachingInfinity) {
  ClientReports r;
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  r.Add({"gpu0", "1000"}, Counts(max, max, kMaxReportedSeconds, max));
  r.Add({"gpu0", "1000"}, Counts(2, 2, kMaxReportedSeconds, 2));
  const ClientCounters sum = r.ByGpu().at("gpu0");
  EXPECT_EQ(sum.fallbacks_total, max);
  EXPECT_EQ(sum.host_waits_total, max);
  EXPECT_EQ(sum.idle_steps_total, max);
  EXPECT_EQ(sum.host_wait_seconds_total, kMaxReportedSeconds);
}

TEST(ClientReportsTest, ZeroIncreasesMakeNoSeriesAndDeviceIdsPastTheBoundShareOne) {
  ClientReports r;
  const ReportBounds total_of_two{0, 2};
  r.Add({"idle-gpu", "1000"}, Counts(0, 0, 0, 0), total_of_two);
  EXPECT_TRUE(r.ByGpu().empty());
  r.Add({"gpu0", "1000"}, Counts(1, 0, 0, 0), total_of_two);
  r.Add({"gpu1", "1000"}, Counts(1, 0, 0, 0), total_of_two);
  for (int i = 0; i < 100; ++i) {
    r.Add({"gpu-x" + std::to_string(i), "1000"}, Counts(1, 0, 0, 0), total_of_two);
  }
  r.Add({"gpu0", "1000"}, Counts(1, 0, 0, 0), total_of_two);  // a known one keeps its series
  const auto by_gpu = r.ByGpu();
  ASSERT_EQ(by_gpu.size(), 3u);
  EXPECT_EQ(by_gpu.at("gpu0").fallbacks_total, 2u);
  EXPECT_EQ(by_gpu.at(kOtherGpus).fallbacks_total, 100u);
  EXPECT_EQ(r.BySeries().at({kOtherGpus, kOtherGpus}).fallbacks_total, 100u);
}

// One uid naming a thousand device ids took every series of the bound, so another user's GPU
// got none of its own (its reports went to "other"): now each uid uses up only its own share.
TEST(ClientReportsTest, OneUidNamingManyDeviceIdsLeavesAnotherUidItsOwnSeries) {
  ClientReports r;
  const ReportBounds bounds{4, 16};
  for (int i = 0; i < 1000; ++i) {
    r.Add({"GPU-adv-" + std::to_string(i), "65534"}, Counts(1, 0, 0, 0), bounds);
  }
  r.Add({"GPU-real", "1000"}, Counts(7, 0, 0, 0), bounds);
  const auto by_series = r.BySeries();
  ASSERT_EQ(by_series.count({"GPU-real", "1000"}), 1u);
  EXPECT_EQ(by_series.at({"GPU-real", "1000"}).fallbacks_total, 7u);
  EXPECT_EQ(by_series.at({kOtherGpus, "65534"}).fallbacks_total, 996u);
  EXPECT_EQ(by_series.size(), 4u + 1u + 1u);  // the attacker's 4, its "other", the victim's
  EXPECT_EQ(by_series.count({kOtherGpus, kOtherGpus}), 0u);
}

std::unique_ptr<Core> MakeCore(base::Clock* clock = nullptr) {
  pool::ArenaOptions a;
  a.size_bytes = 16ull << 20;
  CoreOptions options;
  options.chunk_bytes = 1ull << 20;
  options.clock = clock;
  return std::make_unique<Core>(options, *pool::Arena::Create(a),
                                std::make_unique<copy::ShmCopyEngine>());
}

// Credentials as the listener reads them, of this process's pid (the pid watcher's).
PeerCredentials Peer(uint32_t uid) {
  PeerCredentials p;
  p.known = true;
  p.pid = getpid();
  p.uid = uid;
  p.gid = uid;
  return p;
}

Request Report(uint64_t id, const ClientCounters& c) {
  Request r;
  r.request_id = id;
  r.kind = RequestKind::kClientReport;
  r.report = c;
  return r;
}

TEST(SessionClientReportTest, LatestReportInInfoIncreasesSummedAcrossSessions) {
  base::FakeClock clock(100);
  auto core = MakeCore(&clock);
  CompletionCollector out_a, out_b;
  auto a = Session::Create(core.get(), out_a.emit());
  auto b = Session::Create(core.get(), out_b.emit());
  a->Handle(Report(1, Counts(1, 0, 0, 0)));  // before Hello
  EXPECT_EQ(out_a.Wait(1).status.code(), absl::StatusCode::kFailedPrecondition);
  a->Handle(HelloRequest(2, "a"));
  b->Handle(HelloRequest(2, "b"));
  ASSERT_EQ(out_a.Wait(2).kind, CompletionKind::kHello);
  ASSERT_EQ(out_b.Wait(2).kind, CompletionKind::kHello);
  clock.Advance(5);
  a->Handle(Report(3, Counts(2, 4, 1.0, 1)));
  EXPECT_EQ(out_a.Wait(3).kind, CompletionKind::kClientReportAck);
  a->Handle(Report(4, Counts(5, 4, 1.5, 1)));  // the same process, later
  EXPECT_EQ(out_a.Wait(4).kind, CompletionKind::kClientReportAck);
  b->Handle(Report(3, Counts(10, 0, 0, 0)));
  EXPECT_EQ(out_b.Wait(3).kind, CompletionKind::kClientReportAck);
  a->Handle(Report(5, Counts(4, 4, 1.5, 1)));  // went down: refused, nothing changes
  Completion refused = out_a.Wait(5);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_EQ(a->info().client_report.fallbacks_total, 5u);
  EXPECT_DOUBLE_EQ(a->info().client_report.host_wait_seconds_total, 1.5);
  CoreStats s = core->Stats();
  ASSERT_EQ(s.client_reports_by_gpu.count("gpu0"), 1u);  // HelloRequest's device
  EXPECT_EQ(s.client_reports_by_gpu.at("gpu0").fallbacks_total, 15u);
  EXPECT_EQ(s.client_reports_by_gpu.at("gpu0").host_waits_total, 4u);
  EXPECT_EQ(s.client_reports_by_gpu.at("gpu0").idle_steps_total, 1u);
  a->Close(EndCause::kClosed);
  b->Close(EndCause::kClosed);
  // Sessions that ended stay counted.
  a.reset();
  b.reset();
  EXPECT_EQ(core->Stats().client_reports_by_gpu.at("gpu0").fallbacks_total, 15u);
}

// A probe (Hello transient_device, as offloadctl bench sends) keeps its report on its session but
// adds nothing to the per-GPU sums: those series would outlive the probe.
TEST(SessionClientReportTest, ATransientSessionsReportIsNotSummedByGpu) {
  auto core = MakeCore();
  CompletionCollector out;
  auto probe = Session::Create(core.get(), out.emit());
  Request hello = HelloRequest(1, "probe");
  hello.device_id = "probe-dev";
  hello.transient_device = true;
  probe->Handle(hello);
  ASSERT_EQ(out.Wait(1).kind, CompletionKind::kHello);
  probe->Handle(Report(2, Counts(3, 1, 0.5, 2)));
  EXPECT_EQ(out.Wait(2).kind, CompletionKind::kClientReportAck);
  EXPECT_EQ(probe->info().client_report.fallbacks_total, 3u);
  EXPECT_EQ(core->Stats().client_reports_by_gpu.count("probe-dev"), 0u);
  probe->Close(EndCause::kClosed);
  EXPECT_TRUE(core->Stats().client_reports_by_gpu.empty());
}

// Any uid could say Hello with another GPU's device id and report 1e12 seconds and 2^64-1
// fallbacks: that GPU's sums stayed saturated, so its alerts never fired again. Now such a
// report is refused, the sums stay as they were, and the GPU's own sessions still move them.
TEST(SessionClientReportTest, AForgedReportCannotSaturateAnotherGpusSums) {
  base::FakeClock clock(100);
  auto core = MakeCore(&clock);
  CompletionCollector out_victim, out_attacker;
  auto victim = Session::Create(core.get(), out_victim.emit(), Peer(1000));
  auto attacker = Session::Create(core.get(), out_attacker.emit(), Peer(65534));
  victim->Handle(HelloRequest(1, "train"));      // device gpu0
  attacker->Handle(HelloRequest(1, "forger"));  // says gpu0 too
  ASSERT_EQ(out_victim.Wait(1).kind, CompletionKind::kHello);
  ASSERT_EQ(out_attacker.Wait(1).kind, CompletionKind::kHello);
  clock.Advance(60);
  const uint64_t max = std::numeric_limits<uint64_t>::max();
  attacker->Handle(Report(2, Counts(max, max, kMaxReportedSeconds, max)));
  EXPECT_EQ(out_attacker.Wait(2).status.code(), absl::StatusCode::kInvalidArgument);
  // What a 61-second allowance lets through is real-time bounded, not a saturated sum.
  attacker->Handle(Report(3, Counts(0, 0, 61, 0)));
  EXPECT_EQ(out_attacker.Wait(3).kind, CompletionKind::kClientReportAck);
  victim->Handle(Report(2, Counts(3, 2, 0.5, 0)));
  EXPECT_EQ(out_victim.Wait(2).kind, CompletionKind::kClientReportAck);
  const ClientCounters sum = core->Stats().client_reports_by_gpu.at("gpu0");
  EXPECT_EQ(sum.fallbacks_total, 3u);  // the victim's fallbacks still count
  EXPECT_EQ(sum.host_waits_total, 2u);
  EXPECT_DOUBLE_EQ(sum.host_wait_seconds_total, 61.5);
  // The metrics' series keep the two uids apart: the victim's shows only its own report.
  const auto by_series = core->Stats().client_reports_by_series;
  ASSERT_EQ(by_series.size(), 2u);
  const ClientCounters victims = by_series.at({"gpu0", "1000"});
  EXPECT_EQ(victims.fallbacks_total, 3u);
  EXPECT_DOUBLE_EQ(victims.host_wait_seconds_total, 0.5);
  EXPECT_DOUBLE_EQ(by_series.at({"gpu0", "65534"}).host_wait_seconds_total, 61);
  victim->Close(EndCause::kClosed);
  attacker->Close(EndCause::kClosed);
}

TEST(AuditTest, LinesNameTheSessionItsPeerAndWhatItHeld) {
  SessionInfo s;
  s.session_id = 7;
  s.client_name = "train.py \"rank 0\"\n";
  s.device_id = "GPU-1";
  s.pid = 4242;
  s.uid = 1000;
  s.gid = 100;
  s.peer_known = true;
  s.blocks = 3;
  s.used_bytes = 3ull << 20;
  s.client_report.fallbacks_total = 2;
  EXPECT_EQ(AuditSessionOpen(s, 1),
            "audit: session_open session=7 client=\"train.py \\\"rank 0\\\"\\n\" "
            "device=\"GPU-1\" pid=4242 uid=1000 gid=100 peer_known=true resumed_blocks=1");
  EXPECT_EQ(AuditSessionClose(s, "admin"),
            "audit: session_close session=7 cause=admin blocks=3 bytes=3145728 "
            "client=\"train.py \\\"rank 0\\\"\\n\" device=\"GPU-1\" pid=4242 uid=1000 "
            "fallbacks=2 host_wait_seconds=0.000");
  PeerCredentials caller;
  caller.known = true;
  caller.uid = 0;
  caller.pid = 311;
  EXPECT_EQ(AuditEndSession(caller, 7, "node drain", absl::OkStatus(), s),
            "audit: end_session by_uid=0 by_pid=311 session=7 reason=\"node drain\" outcome=OK "
            "blocks=3 bytes=3145728");
  EXPECT_EQ(AuditEndSession(caller, 9, "", absl::NotFoundError("no session 9"), {}),
            "audit: end_session by_uid=0 by_pid=311 session=9 reason=\"\" outcome=NOT_FOUND "
            "blocks=0 bytes=0");
  // A long reason is cut in the line, so that the fields after it stay there.
  const std::string line =
      AuditEndSession(caller, 9, std::string(100000, '\x01'), absl::OkStatus(), s);
  EXPECT_LT(line.size(), 5000u);
  EXPECT_NE(line.find("...[100000B]\" outcome=OK blocks=3"), std::string::npos) << line;
}

}  // namespace
}  // namespace offloadd::session
