// Daemon configuration: the DaemonConfig protobuf (proto/config.proto) in text format, with
// embedded defaults, an optional file, and command-line flags that override single fields.
// main() reads it and hands plain structs (session::CoreOptions, ...) down; nothing below rpc/
// sees the protobuf.
#ifndef OFFLOADD_SERVER_CONFIG_H_
#define OFFLOADD_SERVER_CONFIG_H_

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/config.pb.h"
#include "server/copy/cuda/cuda_api_sim.h"
#include "server/copy/shm/shm_engine.h"
#include "server/sched/topology.h"
#include "server/session/core.h"

namespace offloadd {

// The embedded defaults, in text format (what --print-default-config prints).
const std::string& DefaultConfigText();

// Parses text-format DaemonConfig over the defaults. A field whose name ends in _bytes or
// _bytes_per_second may be written with a size suffix (`pool_bytes: 256GiB`; ExpandSizeSuffixes).
// A whole-number field (a size in bytes, a count, an id) takes decimal digits only: 0x10, 010
// (which the text format reads as octal 8), 1e3 and 1.5 are refused; socket_mode, a file mode,
// is written in octal (0660; 0x1b0 is refused). Errors: INVALID_ARGUMENT naming the line and
// column of a syntax error, an unknown field, a whole number in another form (with the field,
// the value and the form to use), or a field that is not a list given a second time in one
// message (with both lines); for a size that is not a number it also lists the suffixes.
absl::StatusOr<v1::DaemonConfig> ParseConfig(const std::string& text);
// The most bytes a config file may hold (1 MiB; the defaults are about 3 KiB).
inline constexpr size_t kMaxConfigFileBytes = 1 << 20;
// The file's config, read with base::ReadBoundedFile (opened non-blocking, checked with fstat).
// Errors: NOT_FOUND or PERMISSION_DENIED with the errno text (strerror) when it cannot be read,
// FAILED_PRECONDITION for a directory, FIFO, socket or device, OUT_OF_RANGE for a file over
// kMaxConfigFileBytes, else as ParseConfig, prefixed with the path.
absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path);

// `text` with every "<name>_bytes[_per_second|_total|_per_uid]: <number><suffix>" value
// (suffixes as ParseBytes, unquoted) replaced by its value in bytes: a size's integer as
// ParseBytes reads it, a rate's real number (an exponent and a '-' allowed: 1e3GB), not rounded;
// strings, comments, values neither reads and all other text are unchanged. One pass, linear in
// the text, no recursion.
std::string ExpandSizeSuffixes(const std::string& text);

// Where a config's values came from, for the messages of ValidateConfig and LoadDaemonConfig:
// the config file's path ("" = the embedded defaults alone) and the command-line flags applied
// over it, in order, as (field name with underscores, value as given) pairs.
struct ConfigSources {
  std::string file;
  std::vector<std::pair<std::string, std::string>> flags;
  // The fields the file names ("cuda_sim.gpus" for a nested one), when known (LoadDaemonConfig
  // fills it): a field the file does not name has its default, and is said to.
  std::optional<std::set<std::string>> file_fields;
};
// Checks ranges (ConfigFieldRanges), the text fields with a fixed set of values (backend,
// numa_placement, projector.backend: the message lists them) and combinations;
// INVALID_ARGUMENT with a sentence per problem. A value out of its range or set is given with
// where it came from, by `sources`: "(got 0.5 from
// --ring_poll_seconds=0.5 on the command line)" when a flag set the field (the last one wins),
// else "(got 0.5 from ring_poll_seconds in /etc/offloadd.conf)" when a file was read (", the
// default" instead when sources.file_fields is known and lacks the field), else "(got 0.5)".
absl::Status ValidateConfig(const v1::DaemonConfig& config, const ConfigSources& sources = {});
// A numeric field's allowed values, as ValidateConfig checks them (each is written in one table,
// which flags' messages name too): `field` as the config file names it ("cuda_sim.gpus" for a
// nested one); from min to max, both included, except min when `min_excluded`; 0 is allowed
// as well when `zero_allowed`. max is the largest finite double where any finite number up
// from min is allowed, 2^64 where the field's type alone bounds it. `rule`: the words after the
// field's name in ValidateConfig's message ("must be between 1 and 64").
struct ConfigFieldRange {
  std::string field;
  double min, max;
  bool min_excluded, zero_allowed;
  std::string rule;
};
std::vector<ConfigFieldRange> ConfigFieldRanges();

// The daemon's config: sources.file (LoadConfigFile; the defaults when ""), then sources.flags
// over it in order (ApplyFlag), then ValidateConfig with `sources`. Errors: the first of those
// three's, as each returns it.
absl::StatusOr<v1::DaemonConfig> LoadDaemonConfig(const ConfigSources& sources);

// What --check-config checked: the config LoadDaemonConfig gives for `sources`; `what`, its
// name for the verdict: "FILE" without flags, else "FILE with --a=1 --b=2 from the command line";
// `note`, empty unless the file alone is invalid but valid with the flags: then it says so, with
// the file's problems, for the operator who starts a daemon from the file without those flags.
struct CheckedConfig {
  v1::DaemonConfig config;
  std::string what;
  std::string note;
};
// LoadDaemonConfig(sources) and, with flags, sources.file alone as well. A file valid only with
// the flags passes (the deployments that check a file with flags -- systemd's ExecStartPre, the
// container's entrypoint -- start the daemon with the same flags) with `note` set. Errors:
// LoadDaemonConfig's (the file with the flags).
absl::StatusOr<CheckedConfig> LoadConfigToCheck(const ConfigSources& sources);

// A command-line flag that sets a config field: --name=value or --name value; dashes and
// underscores are interchangeable in names.
struct FlagInfo {
  const char* name;
  const char* help;
};
const std::vector<FlagInfo>& ConfigFlags();
// Applies one flag to the config. Sizes in bytes take ParseBytes' form; rates (_per_second) a
// real number with an optional suffix (25GB, 2.5e10, 1e3GB), as the config file does, kept as
// given (0.4 is 0.4, not rounded to 0); counts and ids decimal digits only (no
// sign, leading 0, 0x, exponent or fraction), within the field's type (the range ValidateConfig
// checks is named); socket_mode octal digits; true/false fields true, false, 1, 0 or nothing.
// Errors: NOT_FOUND for an unknown flag; INVALID_ARGUMENT for a bad value, worded as
// ValidateConfig's: "max_sessions must be a whole number from 0 to 4294967295, in decimal
// digits only (...) (got "0x10" from --max_sessions=0x10 on the command line)".
absl::Status ApplyFlag(const std::string& name, const std::string& value, v1::DaemonConfig* config);

// Parses a size into bytes: decimal digits ("4096"), optionally with a suffix (KiB MiB GiB TiB,
// KB MB GB TB, B), which may follow a decimal fraction that comes to whole bytes ("64MiB",
// "1.5GiB"; not "1.5" or "1.3KiB"). Errors: INVALID_ARGUMENT for any other form (0x10, 1e9, a
// sign, a leading 0), OUT_OF_RANGE beyond 2^64 - 1; each message quotes `text`.
absl::StatusOr<uint64_t> ParseBytes(const std::string& text);

// The shm backend's mapping bounds (max_shm_*).
copy::ShmMappingLimits ToShmMappingLimits(const v1::DaemonConfig& config);

// Resolves an empty socket_path to the default location (see client/socket_path.h), and a
// relative one ("rel.sock", "run/x.sock") against the current directory, so the daemon's
// checks, its log and the path clients are told all name the same absolute file.
std::string ResolveSocketPath(const v1::DaemonConfig& config);
// The socket file's group: -1 for "" (the daemon's), else the gid of the name or number.
// INVALID_ARGUMENT for a group name this machine does not know.
absl::StatusOr<int64_t> ResolveSocketGroup(const v1::DaemonConfig& config);

// CoreOptions from the config alone: its links as given, no discovery.
session::CoreOptions ToCoreOptions(const v1::DaemonConfig& config);

// The config's `gpus` as discovery input.
std::vector<sched::GpuPci> ConfiguredGpuAddresses(const v1::DaemonConfig& config);

// The cuda-sim backend's model from config.cuda_sim (gpus, gpus_per_switch, rates).
copy::SimCudaOptions ToSimCudaOptions(const v1::DaemonConfig& config);
// The cuda-sim backend's switches as links: with cuda_sim.switch_bytes_per_second > 0, one link
// "sim-switch<k>" per simulated switch with its GPUs (SimCudaApi::DeviceUuid, PCI addresses as
// SimCudaApi lists them, NUMA node unknown); without a switch limit none (the GPUs share nothing,
// so each keeps a link of its own).
sched::Topology SimulatedTopology(const v1::DaemonConfig& config);

// The links the daemon schedules: on cuda-sim, SimulatedTopology's; else, with `gpus` (PCI
// addresses: the config's, plus any the copy engine reports), discovered under
// config.sysfs_root (sched::DiscoverTopology); else none (the shm backend's usual case). Then
// the config's `links` applied over them (sched::ApplyLinkOverrides); on a host with one NUMA
// node (sched::SingleOnlineNumaNode under config.sysfs_root), GPUs and links without a node are
// on it. Errors: those two functions' codes, with the message prefixed "topology: ".
absl::StatusOr<sched::Topology> ResolveTopology(const v1::DaemonConfig& config,
                                                const std::vector<sched::GpuPci>& gpus);

// The pool's NUMA nodes (pool::ArenaOptions::numa_nodes) for numa_placement: with "auto", the
// nodes of the topology's GPUs (sched::GpuNumaNodes) that `may_allocate_on` accepts (main: the
// arena's pool::CheckNumaNodes: online, with memory, in this process's cpuset), when two or
// more are left; otherwise (one node, nodes unknown, or "off") none: one unbound slice. GPU
// nodes refused by `may_allocate_on` are appended to `unusable` (optional), for a log line;
// their GPUs' blocks then place as "no_slice".
std::vector<int> PoolNumaNodes(const v1::DaemonConfig& config, const sched::Topology& topology,
                               const std::function<bool(int)>& may_allocate_on,
                               std::vector<int>* unusable = nullptr);

// CoreOptions whose links are `topology`'s (capacities 0 = unpaced; half_duplex from the
// config's link of the same name) and whose host links are the config's host_links plus, when
// numa_node_bytes_per_second > 0, one "numa<N>" per NUMA node over its links not in those.
session::CoreOptions ToCoreOptions(const v1::DaemonConfig& config, const sched::Topology& topology);

}  // namespace offloadd

#endif  // OFFLOADD_SERVER_CONFIG_H_
