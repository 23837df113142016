// offloadd: the per-node memory-offload daemon. See README.md for usage and
// docs/ARCHITECTURE.md for the architecture. Exit codes: 0 after SIGTERM/SIGINT, 2 for
// usage/config errors, 1 for start-up failures (each printed with what to do).
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <iostream>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/version.h"
#include "glog/logging.h"
#include "server/config.h"
#include "server/copy/cuda/cuda_api_sim.h"
#include "server/copy/cuda/cuda_engine.h"
#include "server/copy/cuda/cuda_rate_meter.h"
#include "server/copy/shm/shm_engine.h"
#include "server/host_check.h"
#include "server/metrics/metrics.h"
#include "server/pool/arena.h"
#include "server/projector/blas_core.h"
#include "server/projector/refresh_service.h"
#include "server/rpc/server.h"
#include "server/rpc/socket_activation.h"
#include "server/sched/topology.h"
#include "server/service_notify.h"
#include "server/session/core.h"
#include "server/session/link_calibration.h"
#include "server/spill/spill_tier.h"
#ifdef OFFLOADD_HAVE_CUDA
#include "server/projector/cusolver_backend.h"
#endif

namespace {

using offloadd::base::kVersion;  // common/base/version.h

void PrintHelp() {
  std::cout << "usage: offloadd [--config FILE] [--FLAG=VALUE ...]\n"
               "       offloadd --print-default-config | --check-config FILE | --help\n\n"
               "Options:\n"
               "  --config FILE            DaemonConfig in protobuf text format\n"
               "  --print-default-config   print the embedded defaults and exit\n"
               "  --check-config FILE      validate FILE with the flags given (a note when FILE\n"
               "                           alone is not valid), and check that this host can\n"
               "                           run it (socket, CUDA driver, memlock, MemAvailable,\n"
               "                           spill directory, shared pool object); exit 0, 2\n"
               "                           invalid config, 1 host problem\n"
               "  --version                print the version and exit\n"
               "  --help                   this text\n"
               "Config overrides (dashes and underscores are interchangeable):\n";
  for (const auto& f : offloadd::ConfigFlags()) {
    std::printf("  --%-30s %s\n", f.name, f.help);
  }
  std::cout << "Sizes, counts and ids take decimal digits (sizes also a suffix: KiB MiB GiB TiB "
               "KB MB GB TB, e.g. 64MiB or 1.5GiB); rates take real numbers with an optional "
               "suffix (2.5e10, 25GB, 1e3GB), kept as given, not rounded; *_seconds take real "
               "numbers; socket_mode takes octal digits.\n";
#ifdef OFFLOADD_HAVE_CUDA
  std::cout << "Backends in this build: shm, cuda, cuda-sim (a timing model of GPU copy engines; "
               "it moves the bytes of offloadd.sim_gpu clients only, its timings are simulated)\n";
#else
  std::cout << "Backends in this build: shm, cuda-sim (a timing model of GPU copy engines; it "
               "moves the bytes of offloadd.sim_gpu clients only, its timings are simulated; cuda "
               "needs a build with the CUDA toolkit)\n";
#endif
}

absl::StatusOr<std::unique_ptr<offloadd::copy::CopyEngine>> MakeEngine(
    const offloadd::v1::DaemonConfig& config) {
  if (config.backend() == "shm") {
    return std::unique_ptr<offloadd::copy::CopyEngine>(
        new offloadd::copy::ShmCopyEngine(offloadd::ToShmMappingLimits(config)));
  }
  if (config.backend() == "cuda-sim") {  // simulated GPUs; bytes move for sim_gpu clients only
    const offloadd::v1::CudaSimConfig& sim = config.cuda_sim();
    LOG(WARNING) << "backend cuda-sim: " << sim.gpus() << " GPUs are a timing model ("
                 << sim.engine_bytes_per_second() / 1e9 << " GB/s per direction, "
                 << sim.gpus_per_switch() << " per switch, "
                 << (sim.switch_bytes_per_second() > 0
                         ? absl::StrCat(sim.switch_bytes_per_second() / 1e9, " GB/s per switch")
                         : std::string("no switch limit"))
                 << "); every copy time is SIMULATED, and copies move bytes only for memory a "
                    "client registers from a simulated client GPU (offloadd.sim_gpu, "
                    "SimClientGpu): any other registration moves NO bytes";
    offloadd::copy::CudaEngineOptions options;
    options.asynchronous = config.async_copies();
    return offloadd::copy::NewSimCudaCopyEngine(offloadd::ToSimCudaOptions(config), options);
  }
#ifdef OFFLOADD_HAVE_CUDA
  offloadd::copy::CudaEngineOptions options;
  options.asynchronous = config.async_copies();  // asynchronous by default
  return offloadd::copy::CreateCudaCopyEngine(options);
#else
  return absl::FailedPreconditionError(
      "backend \"cuda\" is not in this build (no CUDA toolkit at build time): rebuild on a "
      "machine with /usr/local/cuda, or use backend: \"shm\"");
#endif
}

// projector.backend: "lapack" (default, or empty) computes every refresh on the host CPU;
// "cusolver" computes refreshes of gradients in CUDA IPC regions with cuSOLVER on the GPU that
// holds them (one stream and handle pair per refresh worker and GPU; cusolver_backend.h), shm
// gradients still with LAPACK — FAILED_PRECONDITION when this build has no CUDA toolkit or no
// driver/device is usable; "auto" is cusolver on a cuda daemon with a usable GPU, else lapack.
absl::Status SetProjectorBackend(const std::string& backend, const std::string& engine,
                                 offloadd::projector::RefreshServiceOptions* options) {
  if (backend.empty() || backend == "lapack") return absl::OkStatus();
#ifdef OFFLOADD_HAVE_CUDA
  if (backend == "auto" && engine != "cuda") {
    LOG(INFO) << "projector backend auto: lapack (the " << engine
              << " backend has no CUDA regions)";
    return absl::OkStatus();
  }
  absl::StatusOr<int> gpus = offloadd::projector::CudaDeviceCount();
  if (!gpus.ok()) {
    if (backend == "auto") {
      LOG(INFO) << "projector backend auto: lapack (" << gpus.status().message() << ")";
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "projector backend cusolver: ", gpus.status().message(),
        ": use projector { backend: \"lapack\" } (or \"auto\") on a host without a GPU"));
  }
  if (engine != "cuda") {
    LOG(WARNING) << "projector backend cusolver applies to gradients in CUDA IPC regions; this "
                 << engine << " daemon has none, so every refresh uses lapack";
  }
  options->gpu_backend_for = offloadd::projector::MakeCusolverBackendSelector();
  options->gpu_backend_name = "cusolver";
  return absl::OkStatus();
#else
  (void)engine;
  (void)options;
  if (backend == "auto") return absl::OkStatus();
  return absl::FailedPreconditionError(
      "projector backend cusolver is not in this build (no CUDA toolkit at build time): "
      "rebuild on a machine with /usr/local/cuda, or use projector { backend: \"lapack\" }");
#endif
}

// The GaLore projector refresh service (config `projector`), or nullptr when it is disabled. shm
// regions open through the daemon's engine when that is shm, else through `own_shm`; CUDA IPC
// regions through the cuda engine; G and P are copied through the links of `core`
// (class PROJECTOR). Sets OpenBLAS's process-wide thread count once.
absl::StatusOr<std::unique_ptr<offloadd::projector::RefreshService>> MakeProjector(
    const offloadd::v1::ProjectorConfig& config, offloadd::session::Core& core,
    offloadd::copy::CopyEngine* own_shm) {
  offloadd::copy::CopyEngine& engine = core.engine();
  if (config.has_enabled() && !config.enabled()) {
    LOG(INFO) << "projector service disabled (projector { enabled: false })";
    return nullptr;
  }
  offloadd::projector::RefreshServiceOptions options;
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  options.workers = config.workers() > 0
                        ? static_cast<int>(std::min<uint32_t>(config.workers(), 64))
                        : (hardware <= 4 ? 1 : 2);
  if (config.history_bytes() > 0) options.history_bytes = config.history_bytes();
  if (config.max_results() > 0) options.max_results = config.max_results();
  if (config.result_ttl_seconds() > 0) options.result_ttl_seconds = config.result_ttl_seconds();
  if (config.max_refresh_bytes() > 0) options.max_refresh_bytes = config.max_refresh_bytes();
  if (config.max_queued_refreshes() > 0) {
    options.max_queued_refreshes = config.max_queued_refreshes();
  }
  if (config.max_queued_refreshes_per_uid() > 0) {
    options.max_queued_refreshes_per_uid = config.max_queued_refreshes_per_uid();
  }
  if (config.max_results_per_uid() > 0) options.max_results_per_uid = config.max_results_per_uid();
  if (config.max_waiting_calls() > 0) options.max_waiters = config.max_waiting_calls();
  if (config.max_waiting_calls_per_uid() > 0) {
    options.max_waiters_per_uid = config.max_waiting_calls_per_uid();
  }
  if (config.history_bytes_per_uid() > 0) {
    options.history_bytes_per_uid = config.history_bytes_per_uid();
  }
  options.copy_through_link = [&core](const offloadd::projector::RegionCopy& c) {
    return core.CopyOverLink(c.device_id, offloadd::sched::TrafficClass::kProjector, *c.engine,
                             c.direction, c.region, c.region_offset, c.host, c.bytes);
  };
  if (absl::Status st = SetProjectorBackend(config.backend(), std::string(engine.name()),
                                            &options);
      !st.ok()) {
    return st;
  }
  const int blas_threads =
      offloadd::projector::SetBlasThreads(offloadd::projector::BlasThreadsFor(options.workers));
  const bool shm_daemon = engine.name() == "shm";
  LOG(INFO) << "projector service: " << options.workers << " refresh workers, " << blas_threads
            << " OpenBLAS threads each, backend lapack"
            << (options.gpu_backend_for ? " (cusolver for CUDA regions)" : "");
  return std::make_unique<offloadd::projector::RefreshService>(
      options, shm_daemon ? &engine : own_shm, shm_daemon ? nullptr : &engine);
}

// The OpenBLAS kernels projector refreshes run on (projector/blas_core.h): called before any
// thread starts and before OpenBLAS loads; --check-config prints the mismatches instead of
// setting OPENBLAS_CORETYPE. Nothing without a projector.
offloadd::projector::BlasCoreChoice SelectBlasCore(const offloadd::v1::DaemonConfig& config,
                                                   bool checking) {
  if (config.projector().has_enabled() && !config.projector().enabled()) return {};
  offloadd::projector::BlasCoreChoice choice =
      offloadd::projector::SelectBlasCoreAtStart(/*apply=*/!checking);
  if (checking) offloadd::projector::PrintBlasCoreNotes(choice);
  return choice;
}

std::atomic<int> g_signal{0};

void RecordSignal(int sig) { g_signal.store(sig); }

// The next of `signals` taken synchronously or recorded by RecordSignal on a library thread;
// 0 after `seconds` without one.
int NextSignal(const sigset_t& signals, double seconds) {
  timespec tick{0, static_cast<long>(seconds * 1e9)};
  int sig = sigtimedwait(&signals, nullptr, &tick);
  if (sig > 0) return sig;
  return g_signal.exchange(0);
}

int Fail(const absl::Status& status, int code) {
  std::cerr << "offloadd: " << status.message() << "\n";
  offloadd::NotifyStatus(absl::StrCat("failed: ", status.message()));
  return code;
}

#ifdef OFFLOADD_HAVE_CUDA
constexpr bool kCudaInBuild = true;
#else
constexpr bool kCudaInBuild = false;
#endif

// --check-config after the config validated: whether this host can run it, each problem on a
// line of its own in the order start-up would meet them. A daemon already listening on the
// socket is a note, not a problem (ExecStartPre runs after the old daemon stopped), and so is a
// metrics_address in use then. Returns the
// exit status: 0, or 1 when the host cannot run the config. `checked.what` names the file checked
// and any flags over it; its note (the file alone is not valid) is printed first.
int CheckHost(const offloadd::CheckedConfig& checked, const std::string& socket_path) {
  const std::string& what = checked.what;
  const offloadd::v1::DaemonConfig& config = checked.config;
  if (!checked.note.empty()) std::cout << "offloadd: note: " << checked.note << "\n";
  std::vector<absl::Status> problems;
  absl::Status socket = offloadd::CheckSocketPath(socket_path);
  if (absl::IsAlreadyExists(socket)) {
    std::cout << "offloadd: note: " << socket.message() << " (fine when this check runs before "
              << "restarting it)\n";
  } else if (!socket.ok()) {
    problems.push_back(socket);
  }
  offloadd::HostFacts facts = offloadd::ReadHostFacts(config, kCudaInBuild);
  if (absl::IsAlreadyExists(socket) && !facts.metrics_address.ok()) {
    // The daemon on the socket likely holds the metrics port too.
    std::cout << "offloadd: note: " << facts.metrics_address.message() << " (fine when the "
              << "daemon on the socket holds it and this check runs before restarting it)\n";
    facts.metrics_address = absl::OkStatus();
  }
  for (absl::Status& st : offloadd::HostProblems(config, facts)) problems.push_back(st);
  for (const std::string& note : offloadd::HostNotes(config, facts)) {
    std::cout << "offloadd: note: " << note << "\n";
  }
  if (problems.empty()) {
    std::cout << "offloadd: " << what << " is valid and this host can run it\n";
    return 0;
  }
  std::cerr << "offloadd: " << what << " is valid, but this host cannot run it ("
            << problems.size() << (problems.size() == 1 ? " problem" : " problems")
            << ", in the order start-up meets them):\n";
  for (const absl::Status& st : problems) std::cerr << "  - " << st.message() << "\n";
  return 1;
}

// The command line: --config/--check-config FILE and config flags (applied later, in order).
struct CommandLine {
  std::string config_file, check_file;
  std::vector<std::pair<std::string, std::string>> overrides;
};

// Reads argv into *out. Returns -1 to go on, else the exit code (after --help, --version,
// --print-default-config or a bad argument).
int ParseCommandLine(int argc, char** argv, CommandLine* out) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      PrintHelp();
      return 0;
    }
    if (arg == "--version") {
      std::cout << "offloadd " << kVersion << "\n";
      return 0;
    }
    if (arg == "--print-default-config" || arg == "--print_default_config") {
      std::cout << offloadd::DefaultConfigText();
      return 0;
    }
    if (arg.rfind("--", 0) != 0) {
      return Fail(absl::InvalidArgumentError(
                      "unexpected argument '" + arg +
                      "' (offloadd --help lists the options; offloadctl asks a running daemon: "
                      "offloadctl stats, sessions, topo, health)"),
                  2);
    }
    std::string name = arg.substr(2), value;
    size_t eq = name.find('=');
    if (eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    } else if (i + 1 < argc && std::string(argv[i + 1]).rfind("--", 0) != 0) {
      value = argv[++i];
    }
    for (char& ch : name) ch = ch == '-' ? '_' : ch;
    if ((name == "config" || name == "check_config") && value.empty()) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
                      "--", name == "config" ? "config" : "check-config", " needs a FILE")),
                  2);
    }
    if (name == "config" || name == "check_config") {
      std::string& file = name == "config" ? out->config_file : out->check_file;
      if (!file.empty() && file != value) {
        const std::string flag = name == "config" ? "--config" : "--check-config";
        return Fail(absl::InvalidArgumentError(absl::StrFormat(
                        "%s is given twice (%s and %s): offloadd reads one config file; give "
                        "one, with flags for what differs",
                        flag, file, value)),
                    2);
      }
      file = value;
    } else {
      out->overrides.emplace_back(name, value);
    }
  }
  if (!out->check_file.empty() && !out->config_file.empty() &&
      out->config_file != out->check_file) {
    return Fail(absl::InvalidArgumentError(absl::StrFormat(
                    "--check-config %s checks that file as --config would read it, and --config "
                    "%s names another: give one of them",
                    out->check_file, out->config_file)),
                2);
  }
  if (!out->check_file.empty()) out->config_file = out->check_file;
  return -1;
}

// The config file (or the defaults), the flags over it, validated; with --check-config, the
// file alone as well (offloadd::LoadConfigToCheck). Errors exit 2.
absl::StatusOr<offloadd::CheckedConfig> LoadConfig(const CommandLine& cl) {
  if (!cl.check_file.empty()) return offloadd::LoadConfigToCheck({cl.check_file, cl.overrides});
  absl::StatusOr<offloadd::v1::DaemonConfig> config =
      offloadd::LoadDaemonConfig({cl.config_file, cl.overrides});
  if (!config.ok()) return config.status();
  return offloadd::CheckedConfig{*std::move(config), cl.config_file};
}

// SIGTERM/SIGINT/SIGHUP are taken synchronously by the main thread (sigtimedwait, NextSignal). They
// are blocked here, so the threads started from here on (copy engine, block store, link
// schedulers, pid watcher, gRPC, projector) inherit the mask. Threads started earlier do not
// block them: the metrics exposer's (started above, so a taken port is reported before the
// pool is mapped) and those libraries start at load time (OpenBLAS's pool). A signal the
// kernel delivers to one of those runs the handler, which records it for the main loop
// (NextSignal) instead of letting it kill the process.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  struct sigaction on_signal {};
  on_signal.sa_handler = RecordSignal;
  sigemptyset(&on_signal.sa_mask);
  for (int s : {SIGTERM, SIGINT, SIGHUP}) sigaction(s, &on_signal, nullptr);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

// The pool's NUMA slices (numa_placement): one per GPU node this process can allocate on, when
// there are two or more; logs the nodes left out and the slicing.
std::vector<int> PoolSlices(const offloadd::v1::DaemonConfig& config,
                            const offloadd::sched::Topology& topology) {
  std::vector<int> unusable_nodes;
  std::vector<int> nodes = offloadd::PoolNumaNodes(
      config, topology,
      [](int node) { return offloadd::pool::CheckNumaNodes({node}).ok(); }, &unusable_nodes);
  if (!unusable_nodes.empty()) {
    LOG(WARNING) << "NUMA placement: GPU node(s) " << absl::StrJoin(unusable_nodes, ", ")
                 << " cannot hold pool memory for this process (offline, no memory, or outside "
                 << "its cpuset): the pool is sliced over the other GPU nodes only, not at all "
                 << "when fewer than two are left, and those GPUs' offloads go elsewhere";
  }
  if (!nodes.empty()) {
    LOG(INFO) << "NUMA placement: the pool is split into one slice per GPU node ("
              << absl::StrJoin(nodes, ", ") << "); each GPU's offloads go to its node's slice";
  }
  return nodes;
}

// Maps the pool, sliced per NUMA node as PoolSlices says (the memlock limit is checked by the
// arena, and only with pool_mlock). On the cuda backend a low RLIMIT_MEMLOCK is only noted:
// cudaHostRegister pins through the NVIDIA driver, which does not charge the limit, and a failed
// registration is logged by the engine while copies go on from pageable memory.
absl::StatusOr<std::unique_ptr<offloadd::pool::Arena>> MapPool(
    const offloadd::v1::DaemonConfig& config, const offloadd::sched::Topology& topology) {
  if (config.backend() == "cuda" && !config.pool_mlock()) {
    rlimit rl{};
    getrlimit(RLIMIT_MEMLOCK, &rl);
    if (!offloadd::pool::CheckMemlockLimit(config.pool_bytes(), rl.rlim_cur,
                                           offloadd::pool::MemlockPrivileged())
             .ok()) {
      LOG(INFO) << "RLIMIT_MEMLOCK (" << rl.rlim_cur << " bytes) is below the pool; the pool "
                << "is pinned with cudaHostRegister, which the limit does not govern";
    }
  }
  offloadd::pool::ArenaOptions arena_options;
  arena_options.size_bytes = config.pool_bytes();
  arena_options.mlock = config.pool_mlock();
  arena_options.huge_pages = config.pool_huge_pages();
  arena_options.shm_name = config.pool_shm_name();
  arena_options.numa_nodes = PoolSlices(config, topology);
  const std::string what = absl::StrCat(
      "mapping and pre-faulting the pool: ", config.pool_bytes(), " bytes",
      arena_options.shm_name.empty() ? std::string(" (anonymous)")
                                     : " (shared: /dev/shm/" + arena_options.shm_name + ")");
  LOG(INFO) << what;
  offloadd::NotifyStatus(what);
  return offloadd::pool::Arena::Create(arena_options);
}

// Logs the topology and warns about cuda links without a configured capacity that start-up
// calibration will not measure (link_calibration: false).
void LogLinks(const offloadd::v1::DaemonConfig& config,
              const offloadd::sched::Topology& topology,
              const offloadd::session::CoreOptions& core_options) {
  if (!topology.links.empty()) {
    LOG(INFO) << "topology ("
              << (config.backend() == "cuda-sim" ? std::string("cuda-sim's simulated switches")
                                                 : "sysfs root " + config.sysfs_root())
              << "):\n"
              << offloadd::sched::FormatTopology(topology);
  }
  const bool gpus = config.backend() == "cuda" || config.backend() == "cuda-sim";
  for (const auto& link : core_options.links) {
    if (gpus && !core_options.link_calibration.at_start && !link.gpus.empty() &&
        (link.d2h_bytes_per_second <= 0 || link.h2d_bytes_per_second <= 0)) {
      LOG(WARNING) << "link " << link.name << " has no configured capacity in one direction "
                   << "and link_calibration is false, so it is unpaced and its utilisation is "
                   << "not reported until `offloadctl calibrate-links` measures it: or set "
                   << "links { name: \"" << link.name
                   << "\" d2h_bytes_per_second: ... h2d_bytes_per_second: ... }";
    }
  }
}

// On the cuda backend, a link of its own for every GPU no link names, so start-up calibration
// measures it (session/link_calibration.h, AddLinksForUnlinkedGpus). Not on cuda-sim: its
// topology is the simulated switches, and a simulated GPU's own rate is the model's.
void AddOwnLinksForUnlinkedGpus(const offloadd::v1::DaemonConfig& config,
                                offloadd::copy::CopyEngine* engine,
                                offloadd::session::CoreOptions& options) {
  auto* cuda = dynamic_cast<offloadd::copy::CudaCopyEngine*>(engine);
  if (cuda == nullptr || config.backend() != "cuda") return;
  auto devices = cuda->Devices();
  if (!devices.ok()) return;
  std::vector<std::string> uuids;
  for (const auto& d : *devices) uuids.push_back(d.uuid);
  const int added = offloadd::session::AddLinksForUnlinkedGpus(uuids, options);
  if (added > 0) {
    LOG(INFO) << "links: " << added << " GPU(s) in no configured or discovered link get a link "
              << "of their own, measured by link calibration";
  }
}

// The cuda engine's copy-rate meter (link calibration), or null for a backend without one.
std::unique_ptr<offloadd::copy::CopyRateMeter> MakeRateMeter(offloadd::copy::CopyEngine* engine) {
  auto* cuda = dynamic_cast<offloadd::copy::CudaCopyEngine*>(engine);
  if (cuda == nullptr) return nullptr;
  return offloadd::copy::NewCudaCopyRateMeter(cuda);
}

// Start-up link calibration (link_calibration: true on cuda/cuda-sim), before the pool is
// pinned and before serving: nothing else uses the links yet. A failure leaves links unpaced
// (each logged) and the daemon serves all the same.
void CalibrateAtStart(offloadd::session::Core& core) {
  if (!core.options().link_calibration.at_start) return;
  absl::StatusOr<offloadd::session::LinkCalibrationReport> report = core.CalibrateLinks();
  if (!report.ok()) {
    LOG(WARNING) << "link calibration at start-up failed: " << report.status().message()
                 << "; links without a configured capacity stay unpaced";
  } else if (!report->links.empty()) {
    LOG(INFO) << "link calibration: " << report->links.size() << " link(s) in "
              << absl::StrFormat("%.2f", report->seconds) << " s (budget "
              << report->budget_seconds << " s)";
  }
}

// Waits for SIGTERM or SIGINT (SIGHUP is logged and ignored); returns the signal.
int WaitForShutdownSignal(const sigset_t& signals) {
  int sig = 0;
  while (true) {
    sig = NextSignal(signals, 0.2);
    if (sig == SIGTERM || sig == SIGINT) break;
    if (sig == SIGHUP) {
      LOG(INFO) << "SIGHUP ignored: offloadd has no configuration reload; restart it to apply "
                   "a changed config";
    }
  }
  offloadd::NotifyStopping(absl::StrCat("signal ", sig, ": finishing copies in flight, closing "
                                        "sessions"));
  return sig;
}

// A second SIGTERM/SIGINT during the drain exits at once.
void ExitOnSecondSignal(const sigset_t& signals, const std::string& socket_path, bool activated) {
  std::thread([signals, socket_path, activated] {
    while (true) {
      int again = NextSignal(signals, 0.2);
      if (again == SIGTERM || again == SIGINT) {
        LOG(WARNING) << "second signal " << again << ": exiting without draining";
        if (!activated) unlink(socket_path.c_str());
        _exit(1);
      }
    }
  }).detach();
}

// The listening socket passed by the service manager (offloadd.socket), already listening: no
// path check, no stale-socket probe; else -1 once socket_path passed its checks. Also raises the
// open file limit.
absl::StatusOr<int> TakeListenFdAndCheck(const offloadd::v1::DaemonConfig& config,
                                         const std::string& socket_path) {
  absl::StatusOr<int> listen_fd = offloadd::rpc::TakeListenFd();
  if (!listen_fd.ok()) return listen_fd.status();
  if (*listen_fd < 0) {
    if (absl::Status st = offloadd::CheckSocketPath(socket_path); !st.ok()) return st;
  }
  if (absl::Status st = offloadd::RaiseFileLimit(config); !st.ok()) return st;
  return listen_fd;
}

// The Prometheus exposer on metrics_address; nullptr when that is empty.
absl::StatusOr<std::unique_ptr<offloadd::metrics::Exposer>> StartExposer(
    const offloadd::v1::DaemonConfig& config) {
  if (config.metrics_address().empty()) {
    return std::unique_ptr<offloadd::metrics::Exposer>();
  }
  return offloadd::metrics::Exposer::Start(config.metrics_address());
}

// The spill tier over the pool; nullptr without a spill directory.
absl::StatusOr<std::unique_ptr<offloadd::spill::SpillTier>> MakeSpillTier(
    const offloadd::spill::SpillOptions& options, const offloadd::pool::Arena& arena) {
  if (options.directory.empty()) return std::unique_ptr<offloadd::spill::SpillTier>();
  return offloadd::spill::SpillTier::Create(options, arena.base(), arena.size_bytes());
}

// With socket activation the .socket unit's SocketMode=/SocketGroup= make the socket file, not
// the config: warns when the config asks for another mode or group than the file has, so the
// setting that is not in force is named rather than silently ignored.
void WarnIfActivatedSocketDiffers(const offloadd::v1::DaemonConfig& config,
                                  const std::string& socket_path) {
  struct stat st;
  if (stat(socket_path.c_str(), &st) != 0) return;
  const uint32_t mode = st.st_mode & 0777;
  const int64_t gid = *offloadd::ResolveSocketGroup(config);
  const bool mode_differs = mode != config.socket_mode();
  const bool group_differs = gid >= 0 && static_cast<int64_t>(st.st_gid) != gid;
  if (!mode_differs && !group_differs) return;
  LOG(WARNING) << absl::StrFormat(
      "the socket %s passed by the service manager has mode %04o and gid %d, but the config "
      "asks for socket_mode %04o%s: with socket activation the .socket unit's SocketMode= and "
      "SocketGroup= apply (systemctl edit offloadd.socket), socket_mode and socket_group do not",
      socket_path, mode, st.st_gid, config.socket_mode(),
      gid >= 0 ? absl::StrFormat(" and socket_group %s (gid %d)", config.socket_group(), gid)
               : std::string());
}

// Logs that the daemon serves, prints the ready line for scripts and tests, records the start-up
// time and tells the service manager (READY=1: `systemctl start` returns now).
void AnnounceServing(const offloadd::v1::DaemonConfig& config, const std::string& socket_path,
                     bool activated, bool metrics_on,
                     std::chrono::steady_clock::time_point process_start) {
  if (activated) {
    LOG(INFO) << "listening socket passed by the service manager (LISTEN_FDS): it stays open "
              << "while offloadd restarts";
    WarnIfActivatedSocketDiffers(config, socket_path);
  }
  LOG(INFO) << "offloadd " << kVersion << " serving on unix:" << socket_path
            << " backend=" << config.backend() << " pool_bytes=" << config.pool_bytes()
            << " chunk_bytes=" << config.chunk_bytes()
            << " ring_poll_seconds=" << config.ring_poll_seconds() << " metrics="
            << (metrics_on ? config.metrics_address() : std::string("off"));
#ifndef OFFLOADD_HAVE_CUDA
  LOG(INFO) << "this build has no CUDA backend; the shm backend is available";
#endif
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - process_start).count();
  offloadd::metrics::Get().start_to_serving_seconds->Set(seconds);
  std::cout << "offloadd: ready on " << socket_path << std::endl;
  offloadd::NotifyReady(absl::StrFormat(
      "serving on %s: pool %d MiB, backend %s, ready %.1f s after start%s", socket_path,
      config.pool_bytes() >> 20, config.backend(), seconds,
      config.backend() == "cuda" ? " (the pool is pinned in the background)" : ""));
}

}  // namespace

int main(int argc, char** argv) {
  const auto process_start = std::chrono::steady_clock::now();
  CommandLine cl;
  if (int code = ParseCommandLine(argc, argv, &cl); code >= 0) return code;
  const bool checking = !cl.check_file.empty();
  // Before any check reads the capabilities (MemlockPrivileged): a non-root daemon holding
  // CAP_IPC_LOCK as permitted only (the image's file capability) makes it effective.
  offloadd::RaiseIpcLockCapability();

  absl::StatusOr<offloadd::CheckedConfig> checked = LoadConfig(cl);
  if (!checked.ok()) return Fail(checked.status(), 2);
  const offloadd::v1::DaemonConfig* config = &checked->config;
  const offloadd::projector::BlasCoreChoice blas_core = SelectBlasCore(*config, checking);
  // Topology: GPUs with a PCI address are found in sysfs; the config's links apply over them.
  // Hook: the cuda backend can report each GPU's UUID and PCI bus id itself
  // (cudaDeviceGetPCIBusId); once CopyEngine exposes them, append them here so `gpus` need not
  // be configured on GPU nodes.
  std::vector<offloadd::sched::GpuPci> gpu_addresses = offloadd::ConfiguredGpuAddresses(*config);
  auto topology = offloadd::ResolveTopology(*config, gpu_addresses);
  if (!topology.ok()) return Fail(topology.status(), checking ? 2 : 1);
  const std::string socket_path = offloadd::ResolveSocketPath(*config);
  if (checking) return CheckHost(*checked, socket_path);

  // Start-up checks run cheapest first and before the pool is pre-faulted (seconds per GiB), so
  // the first error printed is the first thing that blocks: socket, metrics port, backend,
  // memlock, memory.
  // A socket passed by the service manager (offloadd.socket) is already listening: no path
  // check, no stale-socket probe.
  absl::StatusOr<int> listen_fd = TakeListenFdAndCheck(*config, socket_path);
  if (!listen_fd.ok()) return Fail(listen_fd.status(), 1);

  google::InitGoogleLogging(argv[0]);
  FLAGS_logtostderr = true;

  // The metrics exposer starts first, so a taken port is reported before the pool is mapped.
  auto exposer = StartExposer(*config);
  if (!exposer.ok()) return Fail(exposer.status(), 1);

  const sigset_t signals = BlockShutdownSignals();  // threads started from here inherit it

  auto engine = MakeEngine(*config);
  if (!engine.ok()) return Fail(engine.status(), 1);

  auto arena = MapPool(*config, *topology);
  if (!arena.ok()) return Fail(arena.status(), 1);

  offloadd::metrics::Get()
      .build_info->Add({{"version", kVersion}, {"backend", config->backend()}})
      .Set(1);

  offloadd::session::CoreOptions core_options = offloadd::ToCoreOptions(*config, *topology);
  const std::unique_ptr<offloadd::copy::CopyRateMeter> meter = MakeRateMeter(engine->get());
  core_options.link_calibration.meter = meter.get();  // outlives the Core (declared first)
  AddOwnLinksForUnlinkedGpus(*config, engine->get(), core_options);
  LogLinks(*config, *topology, core_options);
  auto spill = MakeSpillTier(core_options.spill, **arena);
  if (!spill.ok()) return Fail(spill.status(), 1);
  offloadd::session::Core core(std::move(core_options), *std::move(arena), *std::move(engine),
                               *std::move(spill));
  CalibrateAtStart(core);
  // cuda: register (pin) the pool with the driver in the background, in chunks <= 64 GiB.
  if (absl::Status st = core.engine().PrepareHostPool(core.pool_base(), core.arena().size_bytes());
      !st.ok()) {
    return Fail(st, 1);
  }
  // The Core's pool, store, spill and link families are read from its state at each scrape.
  if (*exposer) (*exposer)->Register(core.collectable());
  // shm regions of refreshes on a cuda daemon
  offloadd::copy::ShmCopyEngine projector_shm(offloadd::ToShmMappingLimits(*config));
  auto projector = MakeProjector(config->projector(), core, &projector_shm);
  if (!projector.ok()) return Fail(projector.status(), 1);
  if (*projector) offloadd::projector::CheckBlasCoreAtStart(blas_core);  // logs; self-check
  auto server = offloadd::rpc::Server::Start(&core, socket_path, config->socket_mode(),
                                             *offloadd::ResolveSocketGroup(*config),
                                             projector->get(), *listen_fd);
  if (!server.ok()) return Fail(server.status(), 1);
  AnnounceServing(*config, socket_path, *listen_fd >= 0, *exposer != nullptr, process_start);

  const int sig = WaitForShutdownSignal(signals);
  LOG(INFO) << "signal " << sig << ": finishing copies in flight, closing sessions "
            << "(a second SIGTERM/SIGINT exits at once)";
  const bool activated = (*server)->socket_activated();
  ExitOnSecondSignal(signals, socket_path, activated);
  (*server)->Shutdown();
  LOG(INFO) << "offloadd stopped cleanly";
  return 0;
}
