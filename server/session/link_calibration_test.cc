// LinkCalibrator through the Core (link_calibration.h): which links are measured, a configured
// capacity winning over a measured one, links made before and after the measurement paced at it,
// failures keeping the previous capacity, the call's errors, the scrape-time families; and the
// whole chain on the cuda-sim backend (the real meter on the timing model).
#include "server/session/link_calibration.h"

#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/cuda/cuda_api_sim.h"
#include "server/copy/cuda/cuda_rate_meter.h"
#include "server/copy/shm/shm_engine.h"
#include "server/metrics/metrics.h"
#include "server/session/core.h"
#include "server/session/core_metrics.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

// Answers every group with the figures set for its name (or `status`), and records the call.
class FakeMeter : public copy::CopyRateMeter {
 public:
  struct Figures {
    std::map<std::string, std::pair<double, double>> alone;  // gpu -> (d2h, h2d)
    double together_d2h = 0, together_h2d = 0;
    absl::Status status;
  };
  std::map<std::string, Figures> by_link;
  std::vector<std::vector<copy::RateGroup>> calls;
  copy::RateMeasurementOptions last_options;
  std::atomic<bool> block{false}, entered{false};

  std::vector<copy::GroupRates> Measure(const std::vector<copy::RateGroup>& groups,
                                        const copy::RateMeasurementOptions& options) override {
    entered = true;
    while (block) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    calls.push_back(groups);
    last_options = options;
    std::vector<copy::GroupRates> out;
    for (const copy::RateGroup& g : groups) {
      const Figures& f = by_link[g.name];
      copy::GroupRates r;
      r.name = g.name;
      r.gpus = g.gpus;
      r.status = f.status;
      for (const std::string& gpu : g.gpus) {
        auto a = f.alone.find(gpu);
        copy::CopyRates c;
        if (a != f.alone.end()) c.bytes_per_second[0] = a->second.first;
        if (a != f.alone.end()) c.bytes_per_second[1] = a->second.second;
        r.alone.push_back(c);
      }
      r.together.bytes_per_second[0] = f.together_d2h;
      r.together.bytes_per_second[1] = f.together_h2d;
      r.seconds = 0.25;
      out.push_back(r);
    }
    return out;
  }
};

LinkSpec Spec(const std::string& name, std::vector<std::string> gpus, double d2h = 0,
              double h2d = 0, bool half_duplex = false) {
  LinkSpec s;
  s.name = name;
  s.gpus = std::move(gpus);
  s.d2h_bytes_per_second = d2h;
  s.h2d_bytes_per_second = h2d;
  s.half_duplex = half_duplex;
  return s;
}

std::unique_ptr<Core> MakeCore(std::vector<LinkSpec> links, copy::CopyRateMeter* meter,
                               std::unique_ptr<copy::CopyEngine> engine = nullptr) {
  pool::ArenaOptions a;
  a.size_bytes = 8 * kMiB;
  CoreOptions o;
  o.chunk_bytes = kMiB;
  o.links = std::move(links);
  o.link_calibration.meter = meter;
  o.link_calibration.budget_seconds = 2;
  if (engine == nullptr) engine = std::make_unique<copy::ShmCopyEngine>();
  return std::make_unique<Core>(o, *pool::Arena::Create(a), std::move(engine));
}

const LinkInfo& Find(const CoreStats& stats, const std::string& name) {
  for (const LinkInfo& l : stats.links) {
    if (l.name == name) return l;
  }
  ADD_FAILURE() << "no link " << name;
  static LinkInfo none;
  return none;
}

TEST(CalibrationGroupsTest, LinksWithADirectionWithoutCapacityAndWithGpus) {
  std::vector<copy::RateGroup> g = CalibrationGroups(
      {Spec("both", {"a", "b"}), Spec("d2h-only", {"c"}, 5e9, 0), Spec("full", {"d"}, 5e9, 6e9),
       Spec("empty", {}), Spec("half", {"e"}, 7e9, 0, /*half_duplex=*/true),
       Spec("half-open", {"f"}, 0, 9e9, /*half_duplex=*/true)});
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[0].name, "both");
  EXPECT_EQ(g[0].gpus, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(g[1].name, "d2h-only");
  EXPECT_EQ(g[2].name, "half-open");  // a half-duplex link's one capacity is d2h's
}

TEST(AddLinksForUnlinkedGpusTest, AGpuInNoLinkGetsAnUnpacedLinkOfItsOwnToMeasure) {
  CoreOptions o;
  o.link_calibration.at_start = true;
  LinkSpec sw;
  sw.name = "switch0";
  sw.gpus = {"GPU-a", "GPU-b"};
  o.links.push_back(sw);
  EXPECT_EQ(AddLinksForUnlinkedGpus({"GPU-a", "GPU-b", "GPU-c"}, o), 1);
  ASSERT_EQ(o.links.size(), 2u);
  EXPECT_EQ(o.links[1].name, "GPU-c");
  EXPECT_EQ(o.links[1].gpus, std::vector<std::string>{"GPU-c"});
  EXPECT_EQ(o.links[1].d2h_bytes_per_second, 0);
  EXPECT_EQ(o.links[1].h2d_bytes_per_second, 0);
  std::vector<copy::RateGroup> g = CalibrationGroups(o.links);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[1].name, "GPU-c");
  EXPECT_EQ(AddLinksForUnlinkedGpus({"GPU-c"}, o), 0);  // idempotent

  CoreOptions paced = o;  // a configured default is a capacity: nothing to measure
  paced.default_link_bytes_per_second = 25e9;
  EXPECT_EQ(AddLinksForUnlinkedGpus({"GPU-d"}, paced), 0);
  CoreOptions off = o;  // calibration off: no link is added
  off.link_calibration.at_start = false;
  EXPECT_EQ(AddLinksForUnlinkedGpus({"GPU-d"}, off), 0);
  EXPECT_EQ(off.links.size(), 2u);
}

// A configured link that names a GPU in another spelling (case, no "GPU-") names it: the GPU
// gets no link of its own, and its sessions (which send the engine's spelling) use that link,
// the one calibration measures.
TEST(AddLinksForUnlinkedGpusTest, AGpuConfiguredInAnotherSpellingUsesItsConfiguredLink) {
  const std::string listed = "GPU-abcdef01-2345-6789-abcd-ef0123456789";
  CoreOptions o;
  o.link_calibration.at_start = true;
  o.links.push_back(Spec("pcie0", {"ABCDEF01-2345-6789-ABCD-EF0123456789"}));
  EXPECT_EQ(AddLinksForUnlinkedGpus({listed}, o), 0);
  ASSERT_EQ(o.links.size(), 1u);
  auto core = MakeCore(o.links, nullptr);
  EXPECT_EQ(core->LinkNameFor(listed), "pcie0");
  EXPECT_EQ(core->LinkNameFor("gpu-ABCDEF01-2345-6789-abcd-ef0123456789"), "pcie0");
  EXPECT_EQ(core->LinkNameFor("gpu0"), "gpu0");  // not a UUID: its own link, as spelled
}

TEST(LinkCalibratorTest, MeasuredCapacitiesPaceLinksWhereTheConfigGivesNone) {
  FakeMeter meter;
  meter.by_link["sw0"] = {{{"g0", {20e9, 19e9}}, {"g1", {21e9, 18e9}}}, 30e9, 28e9, {}};
  meter.by_link["own"] = {{{"g2", {22e9, 23e9}}}, 22e9, 23e9, {}};
  auto core = MakeCore({Spec("sw0", {"g0", "g1"}, 5e9, 0), Spec("own", {"g2"}),
                        Spec("cfg", {"g3"}, 1e9, 2e9)},
                       &meter);
  // sw0 is made (and unpaced in h2d) before the measurement; own only after it.
  ASSERT_TRUE(core->AcquireLink("g0").ok());
  auto sw0 = core->LinkFor("g0");
  EXPECT_EQ(sw0->h2d->bytes_per_second(), 0);
  auto report = core->CalibrateLinks();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(meter.calls.size(), 1u);
  ASSERT_EQ(meter.calls[0].size(), 2u);  // cfg has both capacities: not measured
  EXPECT_EQ(meter.last_options.budget_seconds, 2);
  EXPECT_EQ(meter.last_options.copy_bytes, 8 * kMiB);  // chunk_bytes (1 MiB), at least 8 MiB
  EXPECT_EQ(sw0->d2h->bytes_per_second(), 5e9);   // configured wins
  EXPECT_EQ(sw0->h2d->bytes_per_second(), 28e9);  // measured, applied to the running link
  ASSERT_TRUE(core->AcquireLink("g2").ok());
  EXPECT_EQ(core->LinkFor("g2")->d2h->bytes_per_second(), 22e9);  // made after: paced at it
  const CoreStats stats = core->Stats();
  EXPECT_EQ(Find(stats, "sw0").h2d_bytes_per_second, 28e9);
  EXPECT_TRUE(Find(stats, "sw0").h2d_calibrated);
  EXPECT_FALSE(Find(stats, "sw0").d2h_calibrated);
  EXPECT_EQ(Find(stats, "cfg").d2h_bytes_per_second, 1e9);
  ASSERT_EQ(report->links.size(), 2u);
  const CalibratedLink& c = report->links[0];
  EXPECT_EQ(c.name, "sw0");
  EXPECT_TRUE(c.error.empty());
  EXPECT_TRUE(c.d2h_configured);
  EXPECT_EQ(c.paced_d2h_bytes_per_second, 5e9);
  EXPECT_EQ(c.paced_h2d_bytes_per_second, 28e9);
  ASSERT_EQ(c.gpus.size(), 2u);
  EXPECT_EQ(c.gpus[1].gpu, "g1");
  EXPECT_EQ(c.gpus[1].h2d_bytes_per_second, 18e9);
  EXPECT_GT(c.measured_at_unix_seconds, 1.6e9);
  EXPECT_EQ(stats.link_calibration.links.size(), 2u);
  EXPECT_EQ(stats.calibrated_links.size(), 2u);
  core->ReleaseLink("g0", false);
  core->ReleaseLink("g2", false);
}

TEST(LinkCalibratorTest, AFailedMeasurementKeepsThePreviousCapacityAndSaysWhy) {
  FakeMeter meter;
  meter.by_link["sw0"] = {{{"g0", {20e9, 20e9}}, {"g1", {20e9, 20e9}}}, 30e9, 31e9, {}};
  auto core = MakeCore({Spec("sw0", {"g0", "g1"})}, &meter);
  ASSERT_TRUE(core->CalibrateLinks().ok());
  // The next run's together windows did not run: only alone figures, and an error.
  meter.by_link["sw0"] = {{{"g0", {10e9, 10e9}}}, 0, 0,
                          absl::DeadlineExceededError("the calibration budget ran out")};
  auto again = core->CalibrateLinks(0.5);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(meter.last_options.budget_seconds, 0.5);
  ASSERT_EQ(again->links.size(), 1u);
  EXPECT_NE(again->links[0].error.find("budget ran out"), std::string::npos);
  EXPECT_EQ(again->links[0].paced_d2h_bytes_per_second, 30e9);  // the first run's
  const CoreStats stats = core->Stats();
  EXPECT_EQ(Find(stats, "sw0").d2h_bytes_per_second, 30e9);
  EXPECT_EQ(Find(stats, "sw0").h2d_bytes_per_second, 31e9);
  ASSERT_EQ(stats.calibrated_links.size(), 1u);
  EXPECT_EQ(stats.calibrated_links[0].d2h_bytes_per_second, 30e9);  // the latest good one
  EXPECT_EQ(stats.link_calibration.links[0].error, again->links[0].error);
}

TEST(LinkCalibratorTest, AHalfDuplexLinkIsPacedAtTheSlowerDirection) {
  FakeMeter meter;
  meter.by_link["h"] = {{{"g0", {20e9, 18e9}}}, 20e9, 18e9, {}};
  auto core = MakeCore({Spec("h", {"g0"}, 0, 0, /*half_duplex=*/true)}, &meter);
  ASSERT_TRUE(core->CalibrateLinks().ok());
  ASSERT_TRUE(core->AcquireLink("g0").ok());
  auto link = core->LinkFor("g0");
  EXPECT_EQ(link->d2h, link->h2d);
  EXPECT_EQ(link->d2h->bytes_per_second(), 18e9);
  core->ReleaseLink("g0", false);
}

TEST(LinkCalibratorTest, RefusedWithoutAMeterTwiceAtOnceForABadBudgetAndWhileDraining) {
  auto shm = MakeCore({Spec("sw0", {"g0"})}, nullptr);
  auto none = shm->CalibrateLinks();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(none.status().message().find("shm"), std::string::npos);

  FakeMeter meter;
  auto core = MakeCore({Spec("sw0", {"g0"})}, &meter);
  EXPECT_EQ(core->CalibrateLinks(-1).status().code(), absl::StatusCode::kInvalidArgument);
  meter.block = true;
  std::thread first([&] { EXPECT_TRUE(core->CalibrateLinks().ok()); });
  while (!meter.entered) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_EQ(core->CalibrateLinks().status().code(), absl::StatusCode::kAborted);
  meter.block = false;
  first.join();
  EXPECT_TRUE(core->CalibrateLinks().ok());  // the next one runs
  core->StopAccepting();
  EXPECT_EQ(core->CalibrateLinks().status().code(), absl::StatusCode::kUnavailable);
}

TEST(LinkCalibratorTest, NothingToMeasureSaysSo) {
  FakeMeter meter;
  auto core = MakeCore({Spec("cfg", {"g0"}, 1e9, 1e9)}, &meter);
  auto report = core->CalibrateLinks();
  ASSERT_TRUE(report.ok());
  EXPECT_TRUE(meter.calls.empty());
  EXPECT_TRUE(report->links.empty());
  EXPECT_NE(report->note.find("nothing to measure"), std::string::npos);
}

// The families offloadd_link_calibrated_bytes_per_second, offloadd_gpu_calibrated_bytes_per_second
// and offloadd_link_calibration_timestamp_seconds, from the stats.
TEST(LinkCalibratorTest, TheLatestFiguresAreScrapeTimeFamilies) {
  CoreStats stats;
  CalibratedLink c;
  c.name = "sw0";
  c.gpus = {{"g0", 20e9, 19e9}, {"g1", 21e9, 18e9}};
  c.d2h_bytes_per_second = 30e9;
  c.h2d_bytes_per_second = 28e9;
  c.measured_at_unix_seconds = 1.7e9;
  stats.calibrated_links.push_back(c);
  std::map<std::string, double> values;
  for (const prometheus::MetricFamily& f : StateFamilies(stats, PoolFacts{})) {
    for (const prometheus::ClientMetric& m : f.metric) {
      std::string key = f.name;
      for (const prometheus::ClientMetric::Label& l : m.label) key += "," + l.name + "=" + l.value;
      values[key] = m.gauge.value;
    }
  }
  EXPECT_EQ(values["offloadd_link_calibrated_bytes_per_second,direction=d2h,link=sw0"], 30e9);
  EXPECT_EQ(values["offloadd_link_calibrated_bytes_per_second,direction=h2d,link=sw0"], 28e9);
  EXPECT_EQ(values["offloadd_gpu_calibrated_bytes_per_second,direction=h2d,gpu=g1,link=sw0"],
            18e9);
  EXPECT_EQ(values["offloadd_link_calibration_timestamp_seconds,link=sw0"], 1.7e9);
}

// The chain on the timing model: the real meter over the cuda-sim engine, 2 GPUs behind a
// 30 GB/s switch at 20 GB/s each. The link is paced within 5 % of 30 GB/s.
TEST(LinkCalibratorSimTest, ASimulatedSwitchLinkIsPacedAtItsModelledCapacity) {
  copy::SimCudaOptions sim;
  sim.model.gpus = 2;
  sim.model.gpus_per_switch = 2;
  sim.model.engine_bytes_per_second = 20e9;
  sim.model.switch_bytes_per_second = 30e9;
  copy::CudaEngineOptions eo;
  eo.asynchronous = true;
  std::unique_ptr<copy::CopyEngine> engine = copy::NewSimCudaCopyEngine(sim, eo);
  auto meter = copy::NewCudaCopyRateMeter(static_cast<copy::CudaCopyEngine*>(engine.get()));
  const std::string g0 = copy::SimCudaApi::DeviceUuid(0), g1 = copy::SimCudaApi::DeviceUuid(1);
  auto core = MakeCore({Spec("sim-switch0", {g0, g1})}, meter.get(), std::move(engine));
  auto report = core->CalibrateLinks();
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->links.size(), 1u);
  const CalibratedLink& c = report->links[0];
  ASSERT_TRUE(c.error.empty()) << c.error;
  EXPECT_NEAR(c.gpus[0].d2h_bytes_per_second, 20e9, 1e9);
  EXPECT_NEAR(c.gpus[1].h2d_bytes_per_second, 20e9, 1e9);
  EXPECT_NEAR(c.paced_d2h_bytes_per_second, 30e9, 1.5e9);
  EXPECT_NEAR(c.paced_h2d_bytes_per_second, 30e9, 1.5e9);
  EXPECT_LT(report->seconds, 2.5);
  const LinkInfo& link = Find(core->Stats(), "sim-switch0");
  EXPECT_NEAR(link.d2h_bytes_per_second, 30e9, 1.5e9);
  EXPECT_TRUE(link.d2h_calibrated && link.h2d_calibrated);
}

}  // namespace
}  // namespace offloadd::session
