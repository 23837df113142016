#include "server/sched/topology.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace offloadd::sched {
namespace fs = std::filesystem;

namespace {

bool IsHex(absl::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return std::isxdigit(c); });
}

bool IsBdf(const std::string& s) { return NormalizeBdf(s).ok(); }

// Reads the first line of a small sysfs file; "" when absent.
std::string ReadLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) return "";
  return std::string(absl::StripAsciiWhitespace(line));
}

int ReadNumaNode(const fs::path& dir) {
  int node = -1;
  const std::string s = ReadLine(dir / "numa_node");
  if (s.empty() || !absl::SimpleAtoi(s, &node)) return -1;
  return node;
}

// current_link_speed ("16.0 GT/s PCIe") x current_link_width ("16") -> bytes/s per direction.
double PcieBytesPerSecond(const fs::path& dir) {
  const std::string speed = ReadLine(dir / "current_link_speed");
  const std::string width = ReadLine(dir / "current_link_width");
  double gts = 0;
  int lanes = 0;
  std::vector<std::string> words = absl::StrSplit(speed, ' ', absl::SkipEmpty());
  if (words.empty() || !absl::SimpleAtod(words[0], &gts) || !absl::SimpleAtoi(width, &lanes) ||
      gts <= 0 || lanes <= 0) {
    return 0;
  }
  const double encoding = gts >= 8.0 ? 128.0 / 130.0 : 8.0 / 10.0;
  return gts * 1e9 * lanes * encoding / 8.0;
}

std::string Describe(const std::vector<std::string>& names) {
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

std::string FormatRate(double bytes_per_second) {
  if (bytes_per_second <= 0) return "-";
  return absl::StrFormat("%.1f GB/s", bytes_per_second / 1e9);
}

// Members' common value, or `none` when they disagree or none is known.
template <typename T, typename F>
T Common(const Topology& t, const std::vector<std::string>& gpus, F field, T none) {
  bool first = true;
  T value = none;
  for (const std::string& g : gpus) {
    const TopologyGpu* gpu = t.FindGpu(g);
    const T v = gpu != nullptr ? field(*gpu) : none;
    if (first) value = v;
    if (v != value) return none;
    first = false;
  }
  return value;
}

}  // namespace

const TopologyLink* Topology::FindLink(const std::string& name) const {
  for (const TopologyLink& l : links) {
    if (l.name == name) return &l;
  }
  return nullptr;
}

const TopologyGpu* Topology::FindGpu(const std::string& gpu) const {
  for (const TopologyGpu& g : gpus) {
    if (g.gpu == gpu) return &g;
  }
  return nullptr;
}

const TopologyLink* Topology::LinkOfGpu(const std::string& gpu) const {
  const TopologyGpu* g = FindGpu(gpu);
  return g == nullptr ? nullptr : FindLink(g->link);
}

absl::StatusOr<std::string> NormalizeBdf(const std::string& bdf) {
  const std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(bdf));
  std::vector<std::string> parts = absl::StrSplit(s, ':');
  if (parts.size() == 2) parts.insert(parts.begin(), "0000");
  std::vector<std::string> dev_fn;
  if (parts.size() == 3) dev_fn = absl::StrSplit(parts[2], '.');
  if (parts.size() != 3 || dev_fn.size() != 2 || !IsHex(parts[0]) || parts[1].size() != 2 ||
      !IsHex(parts[1]) || dev_fn[0].size() != 2 || !IsHex(dev_fn[0]) || dev_fn[1].size() != 1 ||
      dev_fn[1][0] < '0' || dev_fn[1][0] > '7') {
    return absl::InvalidArgumentError(
        absl::StrCat("'", bdf,
                     "' is not a PCI address; expected domain:bus:device.function such as "
                     "0000:18:00.0 (nvidia-smi --query-gpu=pci.bus_id prints it)"));
  }
  std::string domain = parts[0];
  while (domain.size() > 4 && domain[0] == '0') domain.erase(0, 1);
  while (domain.size() < 4) domain.insert(0, "0");
  return absl::StrCat(domain, ":", parts[1], ":", parts[2]);
}

namespace {

// One GPU's place in sysfs: `real` is its canonical device directory, `comps` the path from
// devices/ to it (pci<domain>, bridges..., the GPU).
struct GpuInSysfs {
  std::string bdf;
  fs::path real;
  std::vector<std::string> comps;
};

// Resolves `in` under `root` (checking its id and bus id, unique among `seen_*`).
absl::StatusOr<GpuInSysfs> ResolveGpu(const fs::path& root, const fs::path& devices_dir,
                                      const GpuPci& in, std::set<std::string>* seen_gpus,
                                      std::set<std::string>* seen_bdfs) {
  if (in.gpu.empty()) return absl::InvalidArgumentError("a GPU has an empty device id");
  absl::StatusOr<std::string> bdf = NormalizeBdf(in.bdf);
  if (!bdf.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("GPU ", in.gpu, ": ", bdf.status().message()));
  }
  if (!seen_gpus->insert(in.gpu).second || !seen_bdfs->insert(*bdf).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU ", in.gpu, " at ", *bdf, " is listed twice (same id or address)"));
  }
  std::error_code ec;
  const fs::path entry = root / "bus" / "pci" / "devices" / *bdf;
  GpuInSysfs out{*bdf, fs::canonical(entry, ec), {}};
  if (ec) {
    return absl::NotFoundError(absl::StrCat(
        "GPU ", in.gpu, ": no PCI device ", *bdf, " at ", entry.string(), " (", ec.message(),
        "). Check the bus id (nvidia-smi --query-gpu=uuid,pci.bus_id --format=csv) and that "
        "sysfs is mounted, or describe the links in the config (links { name gpus })"));
  }
  for (const fs::path& p : out.real.lexically_relative(devices_dir)) out.comps.push_back(p.string());
  const std::vector<std::string>& comps = out.comps;
  if (comps.size() < 2 || !absl::StartsWith(comps[0], "pci") || comps.back() != *bdf ||
      !std::all_of(comps.begin() + 1, comps.end(), IsBdf)) {
    return absl::FailedPreconditionError(
        absl::StrCat("GPU ", in.gpu, ": ", entry.string(), " resolves to ", out.real.string(),
                     ", not to a PCI device under ", devices_dir.string(),
                     "/pci*; describe the links in the config instead"));
  }
  return out;
}

// The GPU's bridges and NUMA node (first non-negative value walking up from the GPU).
TopologyGpu DescribeGpu(const GpuPci& in, const GpuInSysfs& s) {
  TopologyGpu g;
  g.gpu = in.gpu;
  g.bdf = s.bdf;
  g.bridges.assign(s.comps.begin() + 1, s.comps.end() - 1);
  fs::path dir = s.real;
  for (size_t depth = s.comps.size(); depth >= 2 && g.numa_node < 0; --depth) {
    g.numa_node = ReadNumaNode(dir);
    dir = dir.parent_path();
  }
  if (!g.bridges.empty()) g.root_port = g.bridges.front();
  return g;
}

// The link `g` shares (named and with its uplink's bus id); `uplink_dir` gets the sysfs
// directory whose link speed bounds it.
TopologyLink LinkOfGpu(const TopologyGpu& g, const fs::path& real, fs::path* uplink_dir) {
  TopologyLink l;
  if (g.bridges.empty()) {
    l.name = absl::StrCat("device-", g.bdf);
    l.uplink_bdf = g.bdf;
    *uplink_dir = real;
  } else if (g.bridges.size() >= 3) {  // root port, ..., upstream port, downstream port
    l.uplink_bdf = g.bridges[g.bridges.size() - 2];
    l.name = absl::StrCat("switch-", l.uplink_bdf);
    *uplink_dir = real.parent_path().parent_path();
  } else {  // on the root port (or behind a single bridge: no switch fan-out to share)
    l.uplink_bdf = g.root_port;
    l.name = absl::StrCat("rootport-", g.root_port);
    *uplink_dir = real;
    for (size_t i = 1; i < g.bridges.size(); ++i) *uplink_dir = uplink_dir->parent_path();
  }
  return l;
}

}  // namespace

absl::StatusOr<Topology> DiscoverTopology(const std::string& sysfs_root,
                                          const std::vector<GpuPci>& gpus) {
  std::error_code ec;
  const fs::path root = fs::canonical(sysfs_root, ec);
  if (ec) {
    return absl::NotFoundError(absl::StrCat("sysfs root '", sysfs_root, "' is not readable (",
                                            ec.message(), "); pass the sysfs mount, /sys"));
  }
  const fs::path devices_dir = root / "devices";
  Topology topo;
  std::map<std::string, TopologyLink> links;
  std::set<std::string> seen_gpus, seen_bdfs;
  for (const GpuPci& in : gpus) {
    auto found = ResolveGpu(root, devices_dir, in, &seen_gpus, &seen_bdfs);
    if (!found.ok()) return found.status();
    TopologyGpu g = DescribeGpu(in, *found);
    fs::path uplink_dir;
    TopologyLink l = LinkOfGpu(g, found->real, &uplink_dir);
    g.link = l.name;
    auto [it, inserted] = links.try_emplace(l.name, l);
    if (inserted) {
      it->second.root_port = g.root_port;
      it->second.numa_node = g.numa_node;
      it->second.pcie_bytes_per_second = PcieBytesPerSecond(uplink_dir);
    }
    it->second.gpus.push_back(g.gpu);
    topo.gpus.push_back(std::move(g));
  }
  for (auto& [name, link] : links) topo.links.push_back(std::move(link));
  // NUMA node of a link: its members' common node (they share a root port, so they agree
  // unless firmware says otherwise).
  for (TopologyLink& l : topo.links) {
    l.numa_node = Common(
        topo, l.gpus, [](const TopologyGpu& g) { return g.numa_node; }, -1);
  }
  return topo;
}

namespace {

// Names unique and present, capacities >= 0, each GPU in at most one override.
absl::Status CheckLinkOverrides(const std::vector<LinkOverride>& overrides) {
  std::set<std::string> names, listed;
  for (const LinkOverride& o : overrides) {
    if (o.name.empty()) return absl::InvalidArgumentError("a link override has no name");
    if (!names.insert(o.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("link '", o.name, "' is configured twice"));
    }
    if (o.d2h_bytes_per_second < 0 || o.h2d_bytes_per_second < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("link '", o.name, "': capacities must be >= 0 bytes/s (0 = unset)"));
    }
    std::set<std::string> in_this_link;
    for (const std::string& g : o.gpus) {
      if (!in_this_link.insert(g).second) {
        return absl::InvalidArgumentError(absl::StrCat("link '", o.name, "' lists GPU ", g,
                                                       " twice; list each GPU once"));
      }
      if (!listed.insert(g).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "GPU ", g, " is listed in more than one link; each GPU belongs to one link"));
      }
    }
  }
  return absl::OkStatus();
}

// An override without GPUs: capacities for the discovered link of that name.
absl::Status SetLinkCapacities(const LinkOverride& o, Topology* topo) {
  auto it = std::find_if(topo->links.begin(), topo->links.end(),
                         [&](const TopologyLink& l) { return l.name == o.name; });
  if (it == topo->links.end()) {
    std::vector<std::string> known;
    for (const TopologyLink& l : topo->links) known.push_back(l.name);
    return absl::NotFoundError(absl::StrCat(
        "link '", o.name, "' lists no GPUs and no discovered link has that name (known: ",
        Describe(known), "); name a known link or list its GPUs"));
  }
  if (o.d2h_bytes_per_second > 0) it->d2h_bytes_per_second = o.d2h_bytes_per_second;
  if (o.h2d_bytes_per_second > 0) it->h2d_bytes_per_second = o.h2d_bytes_per_second;
  it->from_config = true;
  return absl::OkStatus();
}

// Takes `o`'s GPUs out of their links (dropping links left empty and the one named o.name);
// returns the link they start from: a link made of GPUs that all came from one discovered link
// (a rename, or a subset) keeps that link's uplink, PCIe rate and capacities, as does a
// discovered link of the same name (which must then be listed whole).
absl::StatusOr<TopologyLink> DetachGpus(const LinkOverride& o, Topology* topo) {
  const std::set<std::string> members(o.gpus.begin(), o.gpus.end());
  TopologyLink made;
  std::set<std::string> former;
  for (const std::string& g : o.gpus) {
    const TopologyGpu* gpu = topo->FindGpu(g);
    former.insert(gpu == nullptr ? "" : gpu->link);
  }
  if (former.size() == 1) {
    if (const TopologyLink* l = topo->FindLink(*former.begin())) made = *l;
  }
  for (TopologyLink& l : topo->links) {
    if (l.name != o.name) {
      auto end = std::remove_if(l.gpus.begin(), l.gpus.end(),
                                [&](const std::string& g) { return members.count(g) > 0; });
      l.gpus.erase(end, l.gpus.end());
      continue;
    }
    made = l;  // same name: keep its capacities and PCIe rate
    for (const std::string& g : l.gpus) {
      if (!members.count(g)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "link '", o.name, "' is also the discovered link of GPU ", g,
            ", which the override leaves out; list all its GPUs or choose another name"));
      }
    }
  }
  topo->links.erase(
      std::remove_if(topo->links.begin(), topo->links.end(),
                     [&](const TopologyLink& l) { return l.gpus.empty() || l.name == o.name; }),
      topo->links.end());
  made.name = o.name;
  return made;
}

// An override with GPUs: they form link o.name (GPUs not discovered are added).
absl::Status RegroupLink(const LinkOverride& o, Topology* topo) {
  absl::StatusOr<TopologyLink> detached = DetachGpus(o, topo);
  if (!detached.ok()) return detached.status();
  TopologyLink made = *std::move(detached);
  for (const std::string& g : o.gpus) {
    auto it = std::find_if(topo->gpus.begin(), topo->gpus.end(),
                           [&](const TopologyGpu& x) { return x.gpu == g; });
    if (it == topo->gpus.end()) {
      TopologyGpu added;
      added.gpu = g;
      topo->gpus.push_back(added);
      it = topo->gpus.end() - 1;
    }
    it->link = o.name;
  }
  made.gpus = o.gpus;
  made.root_port = Common(
      *topo, made.gpus, [](const TopologyGpu& g) { return g.root_port; }, std::string());
  made.numa_node = Common(
      *topo, made.gpus, [](const TopologyGpu& g) { return g.numa_node; }, -1);
  if (o.d2h_bytes_per_second > 0) made.d2h_bytes_per_second = o.d2h_bytes_per_second;
  if (o.h2d_bytes_per_second > 0) made.h2d_bytes_per_second = o.h2d_bytes_per_second;
  made.from_config = true;
  topo->links.push_back(std::move(made));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Topology> ApplyLinkOverrides(Topology topo,
                                            const std::vector<LinkOverride>& overrides) {
  if (absl::Status st = CheckLinkOverrides(overrides); !st.ok()) return st;
  for (const LinkOverride& o : overrides) {
    absl::Status st = o.gpus.empty() ? SetLinkCapacities(o, &topo) : RegroupLink(o, &topo);
    if (!st.ok()) return st;
  }
  return topo;
}

int SingleOnlineNumaNode(const std::string& sysfs_root) {
  const std::string online = ReadLine(fs::path(sysfs_root) / "devices/system/node/online");
  int node = -1;
  if (online.empty() || !absl::SimpleAtoi(online, &node) || node < 0) return -1;
  return node;  // "0-1" or "0,2" do not parse as one number
}

void AssumeSingleNumaNode(int node, Topology* topo) {
  if (node < 0) return;
  for (TopologyGpu& g : topo->gpus) {
    if (g.numa_node < 0) g.numa_node = node;
  }
  for (TopologyLink& l : topo->links) {
    if (l.numa_node < 0) l.numa_node = node;
  }
}

std::vector<int> GpuNumaNodes(const Topology& topo) {
  std::set<int> nodes;
  for (const TopologyGpu& g : topo.gpus) {
    if (g.numa_node >= 0) nodes.insert(g.numa_node);
  }
  return std::vector<int>(nodes.begin(), nodes.end());
}

std::string FormatTopology(const Topology& topo) {
  std::map<int, std::vector<const TopologyLink*>> by_numa;
  for (const TopologyLink& l : topo.links) by_numa[l.numa_node].push_back(&l);
  std::string out;
  for (const auto& [numa, links] : by_numa) {
    absl::StrAppend(&out, numa < 0 ? "numa node ?" : absl::StrCat("numa node ", numa), "\n");
    for (const TopologyLink* l : links) {
      absl::StrAppend(
          &out, "  link ", l->name, "  root port ", l->root_port.empty() ? "?" : l->root_port,
          "  d2h ", FormatRate(l->d2h_bytes_per_second), "  h2d ",
          FormatRate(l->h2d_bytes_per_second), "  pcie ", FormatRate(l->pcie_bytes_per_second),
          l->from_config ? "  (config)" : "", "\n");
      for (const std::string& g : l->gpus) {
        const TopologyGpu* gpu = topo.FindGpu(g);
        const std::string bdf = gpu == nullptr || gpu->bdf.empty() ? "?" : gpu->bdf;
        absl::StrAppend(&out, "    gpu ", g, "  ", bdf, "\n");
      }
    }
  }
  return out;
}

}  // namespace offloadd::sched
