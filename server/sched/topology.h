// Topology: which GPUs share which PCIe link, found in sysfs and/or given in the config.
//
// Discovery (Linux sysfs, see Documentation/ABI/testing/sysfs-bus-pci in the kernel tree):
// /sys/bus/pci/devices/<bdf> is a symlink whose target is the device's place in the tree,
// /sys/devices/pci<domain>:<bus>/<root port>/<bridge>/.../<bdf>. Every directory between the
// host bridge (pci0000:00) and the GPU is a bridge: first the CPU's root port, then, for each
// PCIe switch, its upstream port and one of its downstream ports. The GPU's parent is thus a
// downstream port and its grandparent the upstream port of the deepest switch; GPUs with the
// same deepest upstream port share that switch's uplink, which is the link we schedule. A GPU
// with no switch above it (parent = root port) has the root port's link to itself; one with no
// bridge at all (a VM's passthrough device on the host bridge) has a link of its own.
// The NUMA node is the first non-negative numa_node file on the walk from the GPU up (-1 when
// none says). The theoretical PCIe rate comes from current_link_speed (GT/s) x
// current_link_width of the uplink's device side, with 128b/130b encoding for >= 8 GT/s (PCIe
// 3.0+) and 8b/10b below: 16 GT/s x16 = 31.5 GB/s, 32 GT/s x16 = 63.0 GB/s per direction.
// Measured rates are lower (docs/ARCHITECTURE.md: 55 GB/s on PCIe 5 H200 nodes); capacities for
// pacing are therefore left to the config (d2h/h2d_bytes_per_second), never taken from this number.
//
// Link names: "switch-<upstream port bdf>", "rootport-<root port bdf>", "device-<gpu bdf>",
// or the config's name. BDFs are normalized to lower case "dddd:bb:dd.f" (the 8-digit domain
// nvidia-smi prints, "00000000:18:00.0", and a missing domain, "18:00.0", are accepted).
#ifndef OFFLOADD_SERVER_SCHED_TOPOLOGY_H_
#define OFFLOADD_SERVER_SCHED_TOPOLOGY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace offloadd::sched {

struct GpuPci {
  std::string gpu;  // device id used everywhere else (UUID or index)
  std::string bdf;  // PCI address, e.g. "0000:18:00.0"
};

struct TopologyGpu {
  std::string gpu;
  std::string bdf;                   // normalized; "" for a GPU known only from the config
  std::string link;                  // name of its link
  std::string root_port;             // bdf; "" when unknown
  int numa_node = -1;                // -1 = unknown
  std::vector<std::string> bridges;  // bdfs from the root port down to the GPU's parent
};

struct TopologyLink {
  std::string name;
  std::vector<std::string> gpus;    // in the order the GPUs were given
  std::string uplink_bdf;           // switch upstream port / root port / device; "" if config
  std::string root_port;            // "" when unknown or when members disagree
  int numa_node = -1;               // -1 when unknown or when members disagree
  double d2h_bytes_per_second = 0;  // capacity per direction, from the config; 0 = unset
  double h2d_bytes_per_second = 0;
  double pcie_bytes_per_second = 0;  // theoretical, from sysfs link speed x width; 0 = unknown
  bool from_config = false;          // created or changed by a LinkOverride
};

struct Topology {
  std::vector<TopologyLink> links;  // discovered ones sorted by name, then config-made ones
  std::vector<TopologyGpu> gpus;    // in the order given (config-only GPUs appended)

  const TopologyLink* FindLink(const std::string& name) const;
  const TopologyLink* LinkOfGpu(const std::string& gpu) const;
  const TopologyGpu* FindGpu(const std::string& gpu) const;
};

// Normalizes a PCI address (see above). INVALID_ARGUMENT when it is not one.
absl::StatusOr<std::string> NormalizeBdf(const std::string& bdf);

// Walks `sysfs_root` ("/sys" in production; a fixture tree in tests) for each GPU.
// Errors: NOT_FOUND when the root or a GPU's bus/pci/devices/<bdf> entry does not exist (the
// message names the GPU and the path, and says how to find the bus id or configure links);
// INVALID_ARGUMENT for a malformed bdf, an empty gpu id, or a GPU or bdf listed twice;
// FAILED_PRECONDITION when the entry does not resolve into <root>/devices/pci*.
absl::StatusOr<Topology> DiscoverTopology(const std::string& sysfs_root,
                                          const std::vector<GpuPci>& gpus);

// A config entry: either sets the capacities of a link by name (gpus empty: the link must
// exist), or makes a link of exactly these GPUs (they leave their discovered links; links left
// empty disappear; GPUs unknown to discovery are added). Capacities of 0 keep the current ones.
struct LinkOverride {
  std::string name;
  std::vector<std::string> gpus;
  double d2h_bytes_per_second = 0;
  double h2d_bytes_per_second = 0;
};

// Applies overrides in order; `topology` may be empty (config-only, e.g. the shm backend).
// Errors (INVALID_ARGUMENT unless said): empty name, a name used twice, a GPU in two
// overrides, a negative capacity, a link name that a discovered link still using other GPUs
// keeps; NOT_FOUND for a capacity-only override of an unknown link (lists the known names).
absl::StatusOr<Topology> ApplyLinkOverrides(Topology topology,
                                            const std::vector<LinkOverride>& overrides);

// The NUMA nodes of the topology's GPUs, each once, ascending, leaving out unknown ones (-1): the
// arena's numa_nodes (pool/arena.h) for a pool sliced per GPU node. Empty when no GPU's node is
// known (then the pool stays one unbound slice and placement is "unbound").
std::vector<int> GpuNumaNodes(const Topology& topology);

// The host's NUMA node when it has exactly one online (<sysfs_root>/devices/system/node/online
// reads a single number, "0"); -1 when it has several, or the file is absent or unreadable.
int SingleOnlineNumaNode(const std::string& sysfs_root);

// On a host with a single NUMA node `node` (SingleOnlineNumaNode; nothing when -1): every GPU
// and link whose node is unknown (-1) is on it. The kernel gives PCI devices no node (-1) where
// there is only one, so without this the pool's node (0) and its GPUs' (unknown) would disagree.
void AssumeSingleNumaNode(int node, Topology* topology);

// A text tree for `offloadctl topo`: NUMA node, then link (root port, capacities), then GPUs.
std::string FormatTopology(const Topology& topology);

}  // namespace offloadd::sched

#endif  // OFFLOADD_SERVER_SCHED_TOPOLOGY_H_
