#include "server/config.h"

#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/socket_path.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace offloadd {

const std::string& DefaultConfigText() {
  static const std::string* text = new std::string(R"pb(# offloadd default configuration (DaemonConfig, text format).
# Empty socket_path: /run/offloadd/offloadd.sock as root, else
# $XDG_RUNTIME_DIR/offloadd/offloadd.sock, else /tmp/offloadd-$UID/offloadd.sock.
socket_path: ""
socket_mode: 0660
# Host pool: 1 GiB here; size it with `offloadctl plan` on a training node.
pool_bytes: 1073741824
pool_mlock: false
pool_huge_pages: false
backend: "shm"
chunk_bytes: 8388608
copy_threads: 2
session_quota_bytes: 0
admission_deadline_seconds: 5
admission_queue_limit: 1024
metrics_address: "127.0.0.1:9464"
default_link_bytes_per_second: 0
)pb");
  return *text;
}

namespace {
class Collector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, int column, const std::string& message) override {
    errors.push_back(absl::StrFormat("line %d column %d: %s", line + 1, column + 1, message));
  }
  std::vector<std::string> errors;
};
}  // namespace

absl::StatusOr<v1::DaemonConfig> ParseConfig(const std::string& text) {
  v1::DaemonConfig config;
  google::protobuf::TextFormat::Parser parser;
  if (!parser.ParseFromString(DefaultConfigText(), &config)) {
    return absl::InternalError("embedded default config does not parse");
  }
  Collector errors;
  parser.RecordErrorsTo(&errors);
  // Merging sets every field the text names, zero values included (metrics_address: "").
  if (!parser.MergeFromString(text, &config)) {
    return absl::InvalidArgumentError("config: " + absl::StrJoin(errors.errors, "; ") +
                                      " (offloadd --print-default-config shows every field)");
  }
  return config;
}

absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrFormat("cannot read config file %s", path));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  auto config = ParseConfig(ss.str());
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, config.status().message()));
  }
  return config;
}

absl::Status ValidateConfig(const v1::DaemonConfig& c) {
  std::vector<std::string> problems;
  if (c.pool_bytes() < (1u << 20)) problems.push_back("pool_bytes must be at least 1 MiB");
  if (c.backend() != "shm" && c.backend() != "cuda") {
    problems.push_back(absl::StrFormat("backend \"%s\" is not known: use \"shm\" or \"cuda\"",
                                       c.backend()));
  }
  if (c.chunk_bytes() < 4096) problems.push_back("chunk_bytes must be at least 4096");
  if (c.copy_threads() < 1 || c.copy_threads() > 64) {
    problems.push_back("copy_threads must be between 1 and 64");
  }
  if (c.admission_deadline_seconds() < 0 || !std::isfinite(c.admission_deadline_seconds())) {
    problems.push_back("admission_deadline_seconds must be >= 0");
  }
  if (c.socket_mode() > 0777) problems.push_back("socket_mode must be a file mode like 0660");
  if (c.default_link_bytes_per_second() < 0) {
    problems.push_back("default_link_bytes_per_second must be >= 0 (0 = unpaced)");
  }
  for (const auto& l : c.links()) {
    if (l.name().empty()) problems.push_back("every link needs a name");
    if (l.gpus().empty()) problems.push_back("link " + l.name() + " lists no gpus");
    if (l.d2h_bytes_per_second() < 0 || l.h2d_bytes_per_second() < 0) {
      problems.push_back("link " + l.name() + ": capacities must be >= 0");
    }
  }
  for (const auto& w : c.gpu_weights()) {
    if (w.weight() < 1) problems.push_back("gpu_weights: weight of " + w.gpu() + " must be >= 1");
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("invalid config: " + absl::StrJoin(problems, "; "));
}

const std::vector<FlagInfo>& ConfigFlags() {
  static const std::vector<FlagInfo>* flags = new std::vector<FlagInfo>{
      {"socket_path", "Unix socket path (default: see README)"},
      {"socket_mode", "socket file mode, octal (default 0660)"},
      {"pool_bytes", "host pool size, e.g. 64GiB (default 1GiB)"},
      {"pool_mlock", "true to mlock the pool"},
      {"pool_huge_pages", "true to back the pool with transparent huge pages"},
      {"backend", "shm | cuda"},
      {"chunk_bytes", "copy chunk size, e.g. 8MiB"},
      {"copy_threads", "copy worker threads per link and direction"},
      {"session_quota_bytes", "per-session quota, 0 = none"},
      {"admission_deadline_seconds", "how long an offload waits for pool space"},
      {"admission_queue_limit", "offloads that may wait for space at once"},
      {"metrics_address", "Prometheus host:port, empty to disable"},
      {"default_link_bytes_per_second", "simulated link rate per direction, e.g. 25GB; 0 = unpaced"},
  };
  return *flags;
}

absl::StatusOr<uint64_t> ParseBytes(const std::string& text) {
  static const std::pair<const char*, double> kSuffixes[] = {
      {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0},
      {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}};
  std::string t(absl::StripAsciiWhitespace(text));
  double mult = 1;
  for (const auto& [suffix, m] : kSuffixes) {
    std::string s(suffix);
    if (t.size() > s.size() && t.compare(t.size() - s.size(), s.size(), s) == 0) {
      t = t.substr(0, t.size() - s.size());
      mult = m;
      break;
    }
  }
  double v;
  if (!absl::SimpleAtod(t, &v) || v < 0 || !std::isfinite(v)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "\"%s\" is not a size: write bytes, optionally with a suffix (64MiB, 1.5GiB)", text));
  }
  return static_cast<uint64_t>(std::llround(v * mult));
}

absl::Status ApplyFlag(const std::string& raw_name, const std::string& value,
                       v1::DaemonConfig* c) {
  std::string name = raw_name;
  for (char& ch : name) ch = ch == '-' ? '_' : ch;
  auto bytes = [&](void (v1::DaemonConfig::*set)(uint64_t)) -> absl::Status {
    auto b = ParseBytes(value);
    if (!b.ok()) return b.status();
    (c->*set)(*b);
    return absl::OkStatus();
  };
  auto boolean = [&](void (v1::DaemonConfig::*set)(bool)) -> absl::Status {
    if (value == "true" || value == "1" || value.empty()) (c->*set)(true);
    else if (value == "false" || value == "0") (c->*set)(false);
    else return absl::InvalidArgumentError("--" + name + " takes true or false");
    return absl::OkStatus();
  };
  auto number = [&](double* out) -> absl::Status {
    if (!absl::SimpleAtod(value, out)) {
      return absl::InvalidArgumentError("--" + name + " takes a number, not \"" + value + "\"");
    }
    return absl::OkStatus();
  };
  double d = 0;
  if (name == "socket_path") {
    c->set_socket_path(value);
  } else if (name == "socket_mode") {
    c->set_socket_mode(static_cast<uint32_t>(std::strtoul(value.c_str(), nullptr, 8)));
  } else if (name == "pool_bytes") {
    return bytes(&v1::DaemonConfig::set_pool_bytes);
  } else if (name == "pool_mlock") {
    return boolean(&v1::DaemonConfig::set_pool_mlock);
  } else if (name == "pool_huge_pages") {
    return boolean(&v1::DaemonConfig::set_pool_huge_pages);
  } else if (name == "backend") {
    c->set_backend(value);
  } else if (name == "chunk_bytes") {
    return bytes(&v1::DaemonConfig::set_chunk_bytes);
  } else if (name == "session_quota_bytes") {
    return bytes(&v1::DaemonConfig::set_session_quota_bytes);
  } else if (name == "copy_threads") {
    if (absl::Status s = number(&d); !s.ok()) return s;
    c->set_copy_threads(static_cast<uint32_t>(d));
  } else if (name == "admission_deadline_seconds") {
    if (absl::Status s = number(&d); !s.ok()) return s;
    c->set_admission_deadline_seconds(d);
  } else if (name == "admission_queue_limit") {
    if (absl::Status s = number(&d); !s.ok()) return s;
    c->set_admission_queue_limit(static_cast<uint32_t>(d));
  } else if (name == "metrics_address") {
    c->set_metrics_address(value);
  } else if (name == "default_link_bytes_per_second") {
    auto b = ParseBytes(value);
    if (!b.ok()) return b.status();
    c->set_default_link_bytes_per_second(static_cast<double>(*b));
  } else {
    return absl::NotFoundError("unknown flag --" + raw_name + " (offloadd --help lists them)");
  }
  return absl::OkStatus();
}

std::string ResolveSocketPath(const v1::DaemonConfig& config) {
  return config.socket_path().empty() ? client::DefaultSocketPath() : config.socket_path();
}

session::CoreOptions ToCoreOptions(const v1::DaemonConfig& c) {
  session::CoreOptions o;
  o.chunk_bytes = c.chunk_bytes();
  o.copy_threads = c.copy_threads();
  o.store.session_quota_bytes = c.session_quota_bytes();
  o.store.admission_deadline_seconds = c.admission_deadline_seconds();
  o.store.admission_queue_limit = c.admission_queue_limit();
  o.default_link_bytes_per_second = c.default_link_bytes_per_second();
  for (const auto& l : c.links()) {
    session::LinkSpec spec;
    spec.name = l.name();
    spec.gpus.assign(l.gpus().begin(), l.gpus().end());
    spec.d2h_bytes_per_second = l.d2h_bytes_per_second();
    spec.h2d_bytes_per_second = l.h2d_bytes_per_second();
    o.links.push_back(std::move(spec));
  }
  for (const auto& w : c.gpu_weights()) o.gpu_weights[w.gpu()] = w.weight();
  return o;
}

}  // namespace offloadd
