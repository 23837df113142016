#include "server/config.h"

#include <grp.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <climits>

#include <cerrno>
#include <cstring>

#include <cmath>
#include <limits>
#include <fstream>
#include <map>
#include <optional>
#include <iterator>
#include <set>
#include <sstream>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/socket_path.h"
#include "common/base/bounded_file.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "google/protobuf/text_format.h"
#include "server/copy/cuda/cuda_api_sim.h"

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
# Restart survival: "" = anonymous pool (lost when the daemon exits); a name keeps the pool and
# its block records in /dev/shm/<name> for the next daemon (docs/failure-modes.md).
pool_shm_name: ""
resume_grace_seconds: 60
# With pool_shm_name: checksum each block's data so a restart serves no changed bytes (costs a
# CRC32C pass per offload; docs/failure-modes.md).
pool_data_checksums: false
# Spill tier below the pool: a directory on local NVMe ("" = none; docs/spill.md).
spill_directory: ""
spill_capacity_bytes: 0
spill_bytes_per_second: 0
spill_posix_io: false
spill_high_water_fraction: 0.9
spill_stage_ahead_blocks: 2
spill_io_threads: 2
backend: "shm"
chunk_bytes: 8388608
copy_threads: 2
# cuda/cuda-sim: chunks posted to the device worker, issued just in time.
async_copies: true
max_chunks_in_flight_per_gpu: 8
session_quota_bytes: 0
admission_deadline_seconds: 5
admission_queue_limit: 1024
metrics_address: "127.0.0.1:9464"
default_link_bytes_per_second: 0
offload_min_share: 0.2
# Topology discovery reads this tree for the GPUs listed in gpus { id pci_bus_id }.
sysfs_root: "/sys"
numa_node_bytes_per_second: 0
# NUMA placement: auto = the pool split per NUMA node with GPUs (2+ such nodes), each GPU's
# offloads in its node's slice; off = one pool, kernel default placement.
numa_placement: "auto"
# Isolation and failure handling: socket group ("" = the daemon's), allow lists (empty = anyone
# who can connect), per-uid quota, request and session limits, client pid watching.
socket_group: ""
uid_quota_bytes: 0
max_requests_in_flight: 4096
max_sessions: 1024
max_sessions_per_uid: 256
max_links: 64
max_shm_mappings_total: 16384
max_shm_mappings_per_uid: 4096
max_shm_mapped_bytes_total: 274877906944  # 256 GiB
max_shm_mapped_bytes_per_uid: 68719476736  # 64 GiB
max_connections_total: 4096
max_connections_per_uid: 512
admin_reserved_connections: 32
unused_connection_timeout_seconds: 30
keepalive_time_seconds: 60
keepalive_timeout_seconds: 60
ring_poll_seconds: 0.0005
max_streams_per_connection: 64
max_pending_hello_streams_total: 4096
max_pending_hello_streams_per_uid: 256
hello_timeout_seconds: 10
shutdown_grace_seconds: 10
watch_client_pids: true
pid_exit_grace_seconds: 2
# cuda/cuda-sim: links without a configured capacity are measured at start-up (each GPU alone,
# a link's GPUs together) and paced at it, within the budget (docs/link-calibration.md).
link_calibration: true
link_calibration_budget_seconds: 5
# cuda-sim's timing model (SIMULATED): 8 GPUs, 4 per switch, 55 GB/s each, no switch limit.
cuda_sim {
  gpus: 8
  gpus_per_switch: 4
  engine_bytes_per_second: 55000000000
  switch_bytes_per_second: 0
}
)pb");
  return *text;
}

namespace {
class Collector : public google::protobuf::io::ErrorCollector {
 public:
  // A message quoting a long token (the parser quotes what it found) is cut to its start.
  void AddError(int line, int column, const std::string& message) override {
    constexpr size_t kMaxMessage = 200;
    const std::string shown =
        message.size() <= kMaxMessage ? message : message.substr(0, kMaxMessage) + "...";
    errors.push_back(absl::StrFormat("line %d column %d: %s", line + 1, column + 1, shown));
    lines.push_back(line);
  }
  std::vector<std::string> errors;
  std::vector<int> lines;  // 0-based
};
}  // namespace

namespace {

// The largest rate a config may give (bytes per second): any finite double; inf and NaN are
// refused (a rate of inf made a link unpaced by accident, NaN paced nothing).
constexpr double kMaxRate = std::numeric_limits<double>::max();
// A bound above every uint64: the field has no upper bound but its type's.
constexpr double kNoMax = 18446744073709551616.0;
// The largest socket_mode (file mode bits; setuid, setgid and sticky are not modes for a socket).
constexpr uint32_t kMaxSocketMode = 0777;

// How FieldRange's bounds read.
enum class Bounds {
  kClosed,        // [min, max]
  kAboveMin,      // (min, max]
  kClosedOrZero,  // 0, or [min, max]
  kClosedOrNonPositive,  // 0 or below (finite), or [min, max]
};

// A numeric field's allowed values: the one place each range is written. ValidateConfig
// checks every field here and words its rule from these numbers (RangeRule); a flag given a
// whole number beyond its field's type names the range here (WholeNumberRule).
struct FieldRange {
  const char* field;  // its name in the config file; "cuda_sim.gpus" for a nested one
  double min, max;    // max kMaxRate: any finite number; kNoMax: no upper bound
  const char* note;   // said after the range, e.g. "(a day)"; "" for none
  Bounds bounds = Bounds::kClosed;
};

constexpr FieldRange kFieldRanges[] = {
    {"pool_bytes", 1 << 20, kNoMax, "(1 MiB)"},
    // Above 1 GiB, rounding a chunk up to the spill tier's alignment could wrap.
    {"chunk_bytes", 4096, 1 << 30, "(1 GiB)"},
    {"resume_grace_seconds", 0, 86400, ""},
    {"spill_high_water_fraction", 0, 1, "", Bounds::kAboveMin},
    {"spill_io_threads", 1, 64, ""},
    {"copy_threads", 1, 64, ""},
    {"admission_deadline_seconds", 0, 86400, "(a day)"},
    // A positive rate below a byte per second paces nothing a link or disk does: a typo.
    {"default_link_bytes_per_second", 1, kMaxRate, "(0 = unpaced)", Bounds::kClosedOrZero},
    {"spill_bytes_per_second", 1, kMaxRate, "(0 = measured at start-up, negative = unpaced)",
     Bounds::kClosedOrNonPositive},
    {"offload_min_share", 0, 1, ""},
    {"numa_node_bytes_per_second", 1, kMaxRate, "(0 = no NUMA level)", Bounds::kClosedOrZero},
    {"hello_timeout_seconds", 0, 3600, "(0 = no timeout)"},
    {"shutdown_grace_seconds", 0, 86400, "(0 = no bound)"},
    {"max_streams_per_connection", 0, 1000000, "(0 = gRPC's default)"},
    {"unused_connection_timeout_seconds", 0, 86400, "(a day)"},
    {"keepalive_time_seconds", 0, 86400, "(0 = no keepalive pings)"},
    {"keepalive_timeout_seconds", 0, 86400, ""},
    // Below ~50 us the kernel's timer slack sets the poll rate, not the value.
    {"ring_poll_seconds", 50e-6, 0.1,
     "(0: clients always wake the daemon; below 0.00005 the kernel's timer slack sets the poll "
     "rate; above 0.1 a submission may wait too long to be taken)",
     Bounds::kClosedOrZero},
    {"pid_exit_grace_seconds", 0, 3600, ""},
    {"link_calibration_budget_seconds", 0, 600, "(5 by default)", Bounds::kAboveMin},
    // Narrowed to int for the model: bounded first.
    {"cuda_sim.gpus", 1, 64, ""},
    {"cuda_sim.gpus_per_switch", 1, 64, ""},
    {"cuda_sim.engine_bytes_per_second", 1, kMaxRate, "(e.g. 55GB)"},
    {"cuda_sim.switch_bytes_per_second", 1, kMaxRate, "(0 = no switch limit)",
     Bounds::kClosedOrZero},
};

const FieldRange* FindFieldRange(const std::string& field) {
  for (const FieldRange& r : kFieldRanges) {
    if (field == r.field) return &r;
  }
  return nullptr;
}

// A bound as a rule gives it: an integer exactly, a fraction in the fewest decimals that read
// back as the same double (0.00005, not 5e-05).
std::string BoundText(double v) {
  if (v == std::floor(v)) return absl::StrFormat("%.0f", v);
  std::string s;
  for (int decimals = 1; decimals <= 17; ++decimals) {
    s = absl::StrFormat("%.*f", decimals, v);
    if (std::strtod(s.c_str(), nullptr) == v) break;
  }
  return s;
}

// "must be between 1 and 64 (note)", "must be in (0, 1]", "must be at least 1048576 (1 MiB)",
// "must be a finite number >= 0 (note)", "must be 0 or between A and B (note)".
std::string RangeRule(const FieldRange& r) {
  std::string rule;
  if (r.max == kMaxRate) {
    const char* other = r.bounds == Bounds::kClosedOrZero          ? "0 or "
                        : r.bounds == Bounds::kClosedOrNonPositive ? "0 or below, or "
                                                                   : "";
    rule = r.min == -kMaxRate ? "must be a finite number"
                              : absl::StrCat("must be ", other, "a finite number ",
                                             r.bounds == Bounds::kAboveMin ? "> " : ">= ",
                                             BoundText(r.min));
  } else if (r.max == kNoMax) {
    rule = "must be at least " + BoundText(r.min);
  } else if (r.bounds == Bounds::kAboveMin) {
    rule = absl::StrFormat("must be in (%s, %s]", BoundText(r.min), BoundText(r.max));
  } else {
    rule = absl::StrFormat("must be %sbetween %s and %s",
                           r.bounds == Bounds::kClosedOrZero ? "0 or " : "", BoundText(r.min),
                           BoundText(r.max));
  }
  return *r.note == '\0' ? rule : absl::StrCat(rule, " ", r.note);
}

// Whether `v` lies in `r` (NaN never does).
bool InRange(const FieldRange& r, double v) {
  if (r.bounds == Bounds::kClosedOrZero && v == 0) return true;
  if (r.bounds == Bounds::kClosedOrNonPositive && v <= 0) return v >= -kMaxRate;
  return (r.bounds == Bounds::kAboveMin ? v > r.min : v >= r.min) && v <= r.max;
}

// The one form of a whole-number field (a count, a uid): decimal digits, without a sign, a
// leading 0 (the config file reads 010 as octal 8), 0x, an exponent or a fraction.
bool IsDecimalWhole(absl::string_view s) {
  return !s.empty() && s.find_first_not_of("0123456789") == absl::string_view::npos &&
         (s == "0" || s[0] != '0');
}

// The rule for a whole-number field's value: its range in kFieldRanges, else its type's, 0 to
// `type_max`, and the form.
std::string WholeNumberRule(const std::string& field, uint64_t type_max) {
  std::string range = absl::StrFormat("from 0 to %d", type_max);
  if (const FieldRange* r = FindFieldRange(field)) {
    range = absl::StrFormat("from %s to %s", BoundText(r->min),
                            r->max == kNoMax ? absl::StrCat(type_max) : BoundText(r->max));
  }
  return absl::StrFormat("must be a whole number %s, in decimal digits only (no sign, leading 0, "
                         "0x, exponent or fraction)",
                         range);
}

// Whether `name` ends in `end` with something before it ("_bytes" alone names no field).
bool NamedWithEnd(absl::string_view name, absl::string_view end) {
  return name.size() > end.size() && absl::EndsWith(name, end);
}

// Whether the config field at `path` is a size in bytes (it takes a size suffix in the file,
// as its flag does): its name ends in _bytes, _bytes_total or _bytes_per_uid.
bool IsSizeField(absl::string_view path) {
  return NamedWithEnd(path, "_bytes") || NamedWithEnd(path, "_bytes_total") ||
         NamedWithEnd(path, "_bytes_per_uid");
}

// The rule for a size in bytes (ParseBytes' form).
constexpr char kSizeRule[] =
    "must be a whole number of bytes in decimal digits, optionally with a size suffix (KiB MiB "
    "GiB TiB KB MB GB TB), like 1073741824, 64MiB or 1.5GiB (no sign, 0x or exponent)";
// The rule for a rate in bytes per second (ParseRate's form).
constexpr char kRateRule[] =
    "must be a rate in bytes per second: a real number, optionally with a size suffix (KiB MiB "
    "GiB TiB KB MB GB TB B), like 25GB, 2.5e10 or 1e3GB";
// The rule for a size beyond uint64.
constexpr char kTooManyBytesRule[] =
    "must be at most 18446744073709551615 bytes (16 EiB, the most a 64-bit count holds)";

// The largest value `field` (a uint32 or uint64 field) holds.
uint64_t MaxOf(const google::protobuf::FieldDescriptor* field) {
  return field->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT64
             ? std::numeric_limits<uint64_t>::max()
             : std::numeric_limits<uint32_t>::max();
}

bool IsWholeNumberField(const google::protobuf::FieldDescriptor* f) {
  using F = google::protobuf::FieldDescriptor;
  return f->cpp_type() == F::CPPTYPE_UINT32 || f->cpp_type() == F::CPPTYPE_UINT64 ||
         f->cpp_type() == F::CPPTYPE_INT32 || f->cpp_type() == F::CPPTYPE_INT64;
}

}  // namespace

namespace {

absl::StatusOr<double> ParseRate(const std::string& text);

// The length of the real number at the start of `s`, the one form of a rate's number in the
// file and on the command line alike: an optional '-', decimal digits, an optional fraction
// (".5") and an optional exponent ("e10", "E-3"); 0 when `s` does not start with one.
size_t RealNumberLength(absl::string_view s) {
  size_t i = s.empty() || s[0] != '-' ? 0 : 1;
  const size_t digits = i;
  while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
  if (i == digits) return 0;
  if (i + 1 < s.size() && s[i] == '.' && absl::ascii_isdigit(s[i + 1])) {
    i += 2;
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
  }
  if (i < s.size() && (s[i] == 'e' || s[i] == 'E')) {
    size_t j = i + 1;
    if (j < s.size() && (s[j] == '+' || s[j] == '-')) ++j;
    const size_t exponent = j;
    while (j < s.size() && absl::ascii_isdigit(s[j])) ++j;
    if (j > exponent) i = j;
  }
  return i;
}

// The rule a size that comes to a fraction of a byte breaks: `value` as written ("1.3KiB"),
// `below` the whole bytes below it (1331).
std::string PartByteRule(absl::string_view value, uint64_t below) {
  return absl::StrFormat(
      "must be a whole number of bytes: %s is between %d and %d bytes; write one of those, or a "
      "fraction that comes to whole bytes with its suffix (1.5KiB is 1536)",
      value, below, below + 1);
}

absl::StatusOr<uint64_t> ReadBytes(const std::string& text, bool* part_byte, uint64_t* below);

bool IsWordChar(char ch) { return absl::ascii_isalnum(ch) || ch == '_'; }

// The length of the sized value at the start of `s`: a number, optional spaces or tabs, and a
// size suffix (KiB MiB GiB TiB KB MB GB TB B) that ends the word; 0 when `s` does not start with
// one. The number of a size is decimal digits with an optional fraction (".5"); of a `rate`,
// RealNumberLength's.
size_t SizedValueLength(absl::string_view s, bool rate) {
  size_t i = 0;
  if (rate) {
    i = RealNumberLength(s);
  } else {
    while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
    if (i + 1 < s.size() && i > 0 && s[i] == '.' && absl::ascii_isdigit(s[i + 1])) {
      i += 2;
      while (i < s.size() && absl::ascii_isdigit(s[i])) ++i;
    }
  }
  if (i == 0) return 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '\t')) ++i;
  if (i < s.size() && absl::StrContains("KMGT", s[i])) {
    ++i;
    if (i < s.size() && s[i] == 'i') ++i;
  } else if (i >= s.size() || s[i] != 'B') {
    return 0;
  }
  if (i >= s.size() || s[i] != 'B') return 0;
  ++i;
  return i < s.size() && IsWordChar(s[i]) ? 0 : i;
}

// Whether `name` (a whole word) names a size or rate field: a size field (IsSizeField) or
// one ending in _bytes_per_second, with something before _bytes.
bool IsSizedName(absl::string_view name) {
  return IsSizeField(name) || NamedWithEnd(name, "_bytes_per_second");
}

// `value` (a sized value, spaces and tabs removed) of the field `name` as the parser reads it:
// a size's whole bytes, a rate's bytes per second (a real, digits enough to read back the same
// double); nullopt when it is not one (left as written: the parser names the line).
std::optional<std::string> ExpandedValue(absl::string_view name, const std::string& value) {
  if (absl::EndsWith(name, "_per_second")) {
    absl::StatusOr<double> rate = ParseRate(value);
    if (!rate.ok()) return std::nullopt;
    return absl::StrFormat("%.17g", *rate);
  }
  absl::StatusOr<uint64_t> bytes = ParseBytes(value);
  if (!bytes.ok()) return std::nullopt;
  return absl::StrCat(*bytes);
}

// `code` (text outside strings and comments) with sized values replaced: a field whose name
// IsSizedName, then ':' (whitespace around it allowed), then a value SizedValueLength reads
// ("pool_bytes: 64 GiB"). A scan, one pass, no backtracking: a file of one long word or
// whitespace run reads in linear time and bounded stack.
std::string ExpandInCode(const std::string& code) {
  std::string out;
  size_t i = 0, copied = 0;
  while (i < code.size()) {
    if (!IsWordChar(code[i])) {
      ++i;
      continue;
    }
    const size_t word = i;
    while (i < code.size() && IsWordChar(code[i])) ++i;
    const absl::string_view name(code.data() + word, i - word);
    if (!IsSizedName(name)) continue;
    size_t j = i;
    while (j < code.size() && absl::ascii_isspace(code[j])) ++j;
    if (j >= code.size() || code[j] != ':') continue;
    ++j;
    while (j < code.size() && absl::ascii_isspace(code[j])) ++j;
    const size_t length =
        SizedValueLength(absl::string_view(code).substr(j), absl::EndsWith(name, "_per_second"));
    if (length == 0) continue;
    std::string value = code.substr(j, length);
    value.erase(std::remove_if(value.begin(), value.end(),
                               [](char ch) { return ch == ' ' || ch == '\t'; }),
                value.end());
    const std::optional<std::string> expanded = ExpandedValue(name, value);
    i = j + length;
    if (!expanded) continue;
    out.append(code, copied, j - copied);
    out += *expanded;
    copied = i;
  }
  out.append(code, copied, std::string::npos);
  return out;
}

}  // namespace

std::string ExpandSizeSuffixes(const std::string& text) {
  std::string out, code;
  size_t i = 0;
  while (i < text.size()) {
    const char c = text[i];
    if (c != '"' && c != '\'' && c != '#') {
      code += c;
      ++i;
      continue;
    }
    out += ExpandInCode(code);
    code.clear();
    size_t end = i + 1;
    if (c == '#') {
      end = text.find('\n', i);
      if (end == std::string::npos) end = text.size();
    } else {
      while (end < text.size() && text[end] != c && text[end] != '\n') {
        end += text[end] == '\\' ? 2 : 1;
      }
      end = std::min(end + 1, text.size());
    }
    out.append(text, i, end - i);
    i = end;
  }
  return out + ExpandInCode(code);
}

namespace {

// Reads config text (sizes expanded) token by token, with a sketch of the text format's
// grammar (anything else it refuses, the parser names the line), and finds what the parser
// lets by: "line L column C: <problem>" for
// - each value of a whole-number field not written in decimal digits (IsDecimalWhole): the
//   text format reads 0x10 as 16 and 010 as octal 8, and refuses 1e3 and 1.5 with a message
//   that does not say what to write. socket_mode, a file mode, is octal by design;
// - each singular field (a nested message too) named a second time in one message: merging
//   the file over the defaults keeps the last value without a word.
class FormChecker {
 public:
  using Tokenizer = google::protobuf::io::Tokenizer;

  // Reads `text`; then forms() and repeats() list what it found.
  void Read(const std::string& text) {
    google::protobuf::io::ArrayInputStream input(text.data(), static_cast<int>(text.size()));
    Collector ignored;  // the parser reports syntax errors
    Tokenizer tokens(&input, &ignored);
    tokens.set_comment_style(Tokenizer::SH_COMMENT_STYLE);
    tokens.set_require_space_after_number(false);
    while (tokens.Next()) {
      const Tokenizer::Token& t = tokens.current();
      if (sized_ && SizedValue(t)) continue;
      const char symbol = t.type == Tokenizer::TYPE_SYMBOL ? t.text[0] : '\0';
      if (symbol == '{' || symbol == '<') {
        scopes_.push_back({field_ != nullptr ? field_->message_type() : nullptr, path_ + "."});
        field_ = nullptr;
      } else if ((symbol == '}' || symbol == '>') && scopes_.size() > 1) {
        path_ = scopes_.back().prefix.substr(0, scopes_.back().prefix.size() - 1);
        scopes_.pop_back();
        field_ = scopes_.back().list;
      } else if (symbol == '[' || symbol == ']') {
        scopes_.back().list = symbol == '[' ? field_ : nullptr;
        if (symbol == ']') field_ = nullptr;
      } else if (symbol != '\0') {
        continue;  // ':' ',' ';' '-'
      } else if (field_ == nullptr) {
        Name(t);
      } else {
        Value(t);
      }
    }
    if (sized_) SizedValue(Tokenizer::Token());
  }
  const std::vector<std::string>& forms() const { return forms_; }
  const std::vector<std::string>& repeats() const { return repeats_; }

 private:
  // An open message: its type (nullptr: unknown), its name's prefix ("cuda_sim."), the field
  // of an open [ ... ] list in it, and the line (1-based) of each singular field named in it.
  struct Scope {
    const google::protobuf::Descriptor* type;
    std::string prefix;
    const google::protobuf::FieldDescriptor* list = nullptr;
    std::map<const google::protobuf::FieldDescriptor*, int> named;
  };

  static std::string At(const Tokenizer::Token& t, const std::string& problem) {
    return absl::StrFormat("line %d column %d: %s", t.line + 1, t.column + 1, problem);
  }
  // A field's name: the field whose value comes next.
  void Name(const Tokenizer::Token& t) {
    Scope& scope = scopes_.back();
    if (t.type != Tokenizer::TYPE_IDENTIFIER || scope.type == nullptr) return;
    field_ = scope.type->FindFieldByName(t.text);
    path_ = scope.prefix + t.text;
    if (field_ == nullptr || field_->is_repeated()) return;
    const auto [first, inserted] = scope.named.emplace(field_, t.line + 1);
    if (!inserted) {
      repeats_.push_back(At(t, absl::StrFormat("%s is given a second time (first on line %d): a "
                                               "field that is not a list is given once; keep "
                                               "one of them",
                                               path_, first->second)));
    }
  }
  void Value(const Tokenizer::Token& t) {
    if (path_ == "socket_mode" && (t.type != Tokenizer::TYPE_INTEGER ||
                                   absl::StartsWithIgnoreCase(t.text, "0x"))) {
      forms_.push_back(At(t, absl::StrFormat("socket_mode must be an octal file mode written "
                                             "with a leading 0, like 0660 (got %s)",
                                             t.text)));
    }
    if (IsSizedName(path_) &&
        (t.type == Tokenizer::TYPE_INTEGER || t.type == Tokenizer::TYPE_FLOAT)) {
      sized_ = {t, field_, path_};  // the next token may be its suffix: SizedValue says
    } else {
      CheckWhole(t, field_, path_);
    }
    field_ = scopes_.back().list;
  }
  // A whole-number field's value `t` in decimal digits (socket_mode, octal, is checked above).
  void CheckWhole(const Tokenizer::Token& t, const google::protobuf::FieldDescriptor* field,
                  const std::string& path) {
    if (!IsWholeNumberField(field) || field->name() == "socket_mode" ||
        (t.type == Tokenizer::TYPE_INTEGER && IsDecimalWhole(t.text))) {
      return;
    }
    const std::string rule =
        IsSizeField(path) ? std::string(kSizeRule) : WholeNumberRule(path, MaxOf(field));
    forms_.push_back(At(t, absl::StrFormat("%s %s (got %s)", path, rule, t.text)));
  }

  // A size or rate field's number that the expansion left as written because, with the word
  // after it, it is not a size or rate: "pool_bytes: 1.3KiB" (a fraction of a byte),
  // "16777216 TiB" (past 64 bits), "5 XiB" (no such suffix), "1e308 TB" (not finite). The
  // text format would read the word as the next field's name. `t`, the token after the number,
  // is taken (true) when it is a word on the same line that looks like a suffix (letters
  // ending in B, at most three): the problem names the value the flag's way. Otherwise the
  // number is checked alone (false: `t` is read as usual).
  bool SizedValue(const Tokenizer::Token& t) {
    const Sized number = *sized_;
    sized_.reset();
    const bool suffix = t.type == Tokenizer::TYPE_IDENTIFIER && t.line == number.token.line &&
                        t.text.size() <= 3 && absl::EndsWith(t.text, "B");
    if (!suffix) {
      CheckWhole(number.token, number.field, number.path);
      return false;
    }
    const std::string value = number.token.text + t.text;
    forms_.push_back(At(number.token, number.path + " " + SizedRule(number.path, value)));
    return true;
  }
  // What `value` ("16777216TiB"), refused for the size or rate field `path`, breaks.
  static std::string SizedRule(const std::string& path, const std::string& value) {
    if (absl::EndsWith(path, "_per_second")) {
      return absl::StrFormat("%s (got %s)", kRateRule, value);
    }
    bool part_byte = false;
    uint64_t below = 0;
    const absl::StatusOr<uint64_t> bytes = ReadBytes(value, &part_byte, &below);
    if (part_byte) return PartByteRule(value, below);
    return absl::StrFormat("%s (got %s)",
                           bytes.status().code() == absl::StatusCode::kOutOfRange
                               ? kTooManyBytesRule
                               : kSizeRule,
                           value);
  }

  // A size or rate field's number, with the field and its name, until the next token says
  // whether a suffix follows.
  struct Sized {
    Tokenizer::Token token;
    const google::protobuf::FieldDescriptor* field;
    std::string path;
  };
  std::vector<Scope> scopes_{{v1::DaemonConfig::descriptor(), ""}};
  std::optional<Sized> sized_;
  const google::protobuf::FieldDescriptor* field_ = nullptr;  // the one whose value comes next
  std::string path_;
  std::vector<std::string> forms_, repeats_;
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
  const std::string expanded = ExpandSizeSuffixes(text);
  FormChecker checker;
  checker.Read(expanded);
  if (!checker.forms().empty()) {
    return absl::InvalidArgumentError("config: " + absl::StrJoin(checker.forms(), "; "));
  }
  // Merging sets every field the text names, zero values included (metrics_address: "").
  if (!parser.MergeFromString(expanded, &config)) {
    std::string hint = " (offloadd --print-default-config shows every field)";
    const std::vector<std::string> lines = absl::StrSplit(text, '\n');
    for (int line : errors.lines) {
      // The line named, or the one before: "pool_bytes: 5 XiB" reads XiB as the next field's
      // name, so the parser names the line after it.
      const bool sized_here = line >= 0 && line < static_cast<int>(lines.size()) &&
                              absl::StrContains(lines[line], "_bytes");
      const bool sized_before = line >= 1 && line - 1 < static_cast<int>(lines.size()) &&
                                absl::StrContains(lines[line - 1], "_bytes");
      if (sized_here || sized_before) {
        hint =
            " (sizes are plain integers of bytes and rates real numbers of bytes per second, "
            "either with one of the suffixes KiB MiB GiB TiB KB MB GB TB if wanted, e.g. "
            "pool_bytes: 64GiB or default_link_bytes_per_second: 25GB; offloadd "
            "--print-default-config shows every field)";
      }
    }
    return absl::InvalidArgumentError("config: " + absl::StrJoin(errors.errors, "; ") + hint);
  }
  if (!checker.repeats().empty()) {
    return absl::InvalidArgumentError("config: " + absl::StrJoin(checker.repeats(), "; "));
  }
  return config;
}

absl::StatusOr<v1::DaemonConfig> LoadConfigFile(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot read config file %s: it is a directory; give the file (e.g. %s/offloadd.conf)",
        path, path));
  }
  absl::StatusOr<std::string> text = base::ReadBoundedFile(path, kMaxConfigFileBytes,
                                                           "config file");
  if (!text.ok()) return text.status();
  auto config = ParseConfig(*text);
  if (!config.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", path, config.status().message()));
  }
  return config;
}

namespace {

// Collects one sentence per config problem, in the order the checks run.
struct Problems {
  const ConfigSources& sources;
  std::vector<std::string> sentences;

  void Add(std::string sentence) { sentences.push_back(std::move(sentence)); }
  // Adds "<field> <rule> (got <shown><Source>)" unless `ok`; `field` is its name in the config
  // file ("cuda_sim.gpus" for a nested one).
  void Require(bool ok, const std::string& field, const std::string& shown,
               const std::string& rule) {
    if (!ok) Add(absl::StrFormat("%s %s (got %s%s)", field, rule, shown, Source(field)));
  }
  // A text field whose value must be one of `values`: "<field> must be one of "a", "b" or "c"
  // <note> (got "x"<Source>)".
  void OneOf(const std::string& field, const std::string& value,
             const std::vector<std::string>& values, const std::string& note) {
    if (std::find(values.begin(), values.end(), value) != values.end()) return;
    std::vector<std::string> quoted;
    for (const std::string& v : values) quoted.push_back(absl::StrCat("\"", v, "\""));
    const std::string last = quoted.back();
    quoted.pop_back();
    const std::string rule =
        absl::StrCat("must be ", quoted.size() > 1 ? "one of " : "", absl::StrJoin(quoted, ", "),
                     " or ", last, note.empty() ? "" : " ", note);
    Require(false, field, absl::StrCat("\"", value, "\""), rule);
  }
  // A value as a message gives it: an integer exactly, a real with the fewest digits that read
  // back as the same double (so it never reads as the bound it missed).
  template <typename V>
  static std::string Shown(V value) {
    if constexpr (std::is_integral_v<V>) {
      return absl::StrCat(value);
    } else {
      if (value == std::floor(value) && std::fabs(value) < 1e15) {
        return absl::StrFormat("%.0f", value);
      }
      std::string s;
      for (int digits = 1; digits <= 17; ++digits) {
        s = absl::StrFormat("%.*g", digits, value);
        if (std::strtod(s.c_str(), nullptr) == value) break;
      }
      return s;
    }
  }
  // " from --field=value on the command line" when a flag set `field` (the last such flag:
  // each overrides the one before), else " from field in FILE" when a file was read, else ""
  // (the embedded defaults, which are valid, or a text given to ParseConfig).
  std::string Source(const std::string& field) const {
    for (auto flag = sources.flags.rbegin(); flag != sources.flags.rend(); ++flag) {
      if (flag->first == field) {
        return absl::StrFormat(" from --%s=%s on the command line", field, flag->second);
      }
    }
    if (sources.file.empty()) return "";
    if (sources.file_fields && sources.file_fields->count(field) == 0) return ", the default";
    return absl::StrFormat(" from %s in %s", field, sources.file);
  }
  // A per-uid limit must not exceed its total when both are set (0 = no limit); both values
  // are given with where they came from.
  void PerUidWithinTotal(uint64_t per_uid, uint64_t total, const char* per_uid_name,
                         const char* total_name) {
    if (per_uid > 0 && total > 0 && per_uid > total) {
      Add(absl::StrFormat("%s must not exceed %s (got %d%s; %s is %d%s)", per_uid_name,
                          total_name, per_uid, Source(per_uid_name), total_name, total,
                          Source(total_name)));
    }
  }
};

bool ValidCapacity(double bytes_per_second) {
  return bytes_per_second == 0 || (bytes_per_second >= 1 && bytes_per_second <= kMaxRate);
}

// "<what>: capacities must be 0 or finite numbers >= 1 (got d2h_bytes_per_second D,
// h2d_bytes_per_second H)" (links and host links are set in the file only).
std::string CapacityProblem(const std::string& what, double d2h, double h2d) {
  return absl::StrFormat(
      "%s: capacities must be 0 or finite numbers >= 1 (bytes per second; a positive rate "
      "below 1 paces nothing a link does) (got d2h_bytes_per_second %s, "
      "h2d_bytes_per_second %s)",
      what, Problems::Shown(d2h), Problems::Shown(h2d));
}

bool ValidShmName(const std::string& name) {
  return name.size() <= 200 &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                "0123456789._-") == std::string::npos &&
         name != "." && name != "..";
}

// `path`'s value in `config` (a numeric field; "cuda_sim.gpus" for a nested one): as a number
// to check and as a message shows it (an integer exactly).
std::pair<double, std::string> NumericValue(const google::protobuf::Message& config,
                                            const std::string& path) {
  using F = google::protobuf::FieldDescriptor;
  const google::protobuf::Message* m = &config;
  const F* f = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (f != nullptr) m = &m->GetReflection()->GetMessage(*m, f);
    f = m->GetDescriptor()->FindFieldByName(std::string(part));
    if (f == nullptr) return {std::nan(""), "a field the config does not have"};
  }
  const google::protobuf::Reflection* r = m->GetReflection();
  switch (f->cpp_type()) {
    case F::CPPTYPE_UINT32: return {r->GetUInt32(*m, f), Problems::Shown(r->GetUInt32(*m, f))};
    case F::CPPTYPE_UINT64:
      return {static_cast<double>(r->GetUInt64(*m, f)), Problems::Shown(r->GetUInt64(*m, f))};
    default: return {r->GetDouble(*m, f), Problems::Shown(r->GetDouble(*m, f))};
  }
}

// Every field of kFieldRanges, in its order.
void CheckRanges(const v1::DaemonConfig& c, Problems* p) {
  for (const FieldRange& r : kFieldRanges) {
    const auto [value, shown] = NumericValue(c, r.field);
    p->Require(InRange(r, value), r.field, shown, RangeRule(r));
  }
}

// The text fields with a fixed set of values, socket_mode, pool_shm_name and checksums.
void CheckChoicesAndPool(const v1::DaemonConfig& c, Problems* p) {
  p->OneOf("backend", c.backend(), {"shm", "cuda", "cuda-sim"},
           "(cuda-sim: a timing model of GPU copy engines for simulated clients and benchmarks)");
  p->OneOf("numa_placement", c.numa_placement(), {"auto", "off"},
           "(auto: slice the pool per NUMA node with GPUs when there are two or more)");
  p->OneOf("projector.backend", c.projector().backend(), {"lapack", "cusolver", "auto", ""},
           "(lapack: the host CPU, the default, as is \"\"; cusolver: gradients on a GPU, "
           "solved there)");
  // Shown in octal, as modes are written; the text format reads 660 (no leading 0) as decimal.
  p->Require(c.socket_mode() <= kMaxSocketMode, "socket_mode",
             absl::StrFormat("0%o (decimal %d)", c.socket_mode(), c.socket_mode()),
             absl::StrFormat(
                 "must be a file mode from 0 to 0%o; in the config file write it with a leading "
                 "0, which the text format reads as octal (socket_mode: 0660), and on the command "
                 "line as octal digits (--socket_mode=660)",
                 kMaxSocketMode));
  if (!ValidShmName(c.pool_shm_name())) {
    p->Add(absl::StrFormat(
        "pool_shm_name \"%s\" must be at most 200 letters, digits, '.', '_' or '-' (it names "
        "/dev/shm/<pool_shm_name>)",
        c.pool_shm_name()));
  }
  // Relative to the daemon's working directory, which is / under the systemd unit.
  p->Require(c.spill_directory().empty() || c.spill_directory()[0] == '/', "spill_directory",
             "\"" + c.spill_directory() + "\"",
             "must be an absolute path (a relative one would follow the daemon's working "
             "directory, / under the systemd unit): give the whole path, like "
             "/var/lib/offloadd/spill");
  if (c.pool_data_checksums() && c.pool_shm_name().empty()) {
    p->Add("pool_data_checksums needs pool_shm_name: an anonymous pool is not adopted after a "
           "restart, so there is nothing to check; set pool_shm_name or drop pool_data_checksums");
  }
}

// metrics_address: "" (no metrics) or HOST:PORT, a host and a decimal port from 1 to 65535
// ("[::1]:9464" for IPv6). The HTTP server refused the rest only at start-up; port 0 would
// serve on a port the kernel picks, which no scrape config names.
void CheckMetricsAddress(const v1::DaemonConfig& c, Problems* p) {
  const std::string& address = c.metrics_address();
  if (address.empty()) return;
  const size_t colon = address.rfind(':');
  const std::string port = colon == std::string::npos ? "" : address.substr(colon + 1);
  uint32_t number = 0;
  const bool ok = colon != std::string::npos && colon > 0 && !port.empty() &&
                  port.size() <= 5 && port.find_first_not_of("0123456789") == std::string::npos &&
                  absl::SimpleAtoi(port, &number) && number >= 1 && number <= 65535;
  p->Require(ok, "metrics_address", "\"" + address + "\"",
             "must be HOST:PORT with a port from 1 to 65535, like 127.0.0.1:9464, 0.0.0.0:9464 "
             "or [::1]:9464, or \"\" to serve no metrics");
}

void CheckLinks(const v1::DaemonConfig& c, Problems* p) {
  for (const auto& l : c.links()) {
    if (l.name().empty()) p->Add("every link needs a name");
    const bool sim_switches =
        c.backend() == "cuda-sim" && c.cuda_sim().switch_bytes_per_second() > 0;
    if (l.gpus().empty() && c.gpus().empty() && !sim_switches) {
      p->Add("link " + l.name() +
             " lists no gpus (a link without gpus only sets the capacities of a "
             "discovered link: list the GPUs' pci_bus_id in gpus)");
    }
    if (!ValidCapacity(l.d2h_bytes_per_second()) || !ValidCapacity(l.h2d_bytes_per_second())) {
      p->Add(CapacityProblem("link " + l.name(), l.d2h_bytes_per_second(),
                             l.h2d_bytes_per_second()));
    }
    if (l.half_duplex() && l.h2d_bytes_per_second() != 0) {
      p->Add("link " + l.name() +
             " is half_duplex: its one capacity is d2h_bytes_per_second; remove "
             "h2d_bytes_per_second");
    }
  }
  for (const auto& w : c.gpu_weights()) {
    if (w.weight() < 1) p->Add("gpu_weights: weight of " + w.gpu() + " must be >= 1");
  }
}

void CheckPerUidLimits(const v1::DaemonConfig& c, Problems* p) {
  p->PerUidWithinTotal(c.max_shm_mappings_per_uid(), c.max_shm_mappings_total(),
                       "max_shm_mappings_per_uid", "max_shm_mappings_total");
  p->PerUidWithinTotal(c.max_shm_mapped_bytes_per_uid(), c.max_shm_mapped_bytes_total(),
                       "max_shm_mapped_bytes_per_uid", "max_shm_mapped_bytes_total");
  p->PerUidWithinTotal(c.max_connections_per_uid(), c.max_connections_total(),
                       "max_connections_per_uid", "max_connections_total");
  p->PerUidWithinTotal(c.max_sessions_per_uid(), c.max_sessions(), "max_sessions_per_uid",
                       "max_sessions");
  p->PerUidWithinTotal(c.max_pending_hello_streams_per_uid(),
                       c.max_pending_hello_streams_total(), "max_pending_hello_streams_per_uid",
                       "max_pending_hello_streams_total");
}

void CheckGpus(const v1::DaemonConfig& c, Problems* p) {
  std::set<std::string> gpu_ids;
  for (const auto& g : c.gpus()) {
    if (g.id().empty()) p->Add("every entry of gpus needs an id");
    if (!gpu_ids.insert(g.id()).second) p->Add("gpu " + g.id() + " is listed twice");
    if (!sched::NormalizeBdf(g.pci_bus_id()).ok()) {
      p->Add(absl::StrFormat(
          "gpu %s: pci_bus_id \"%s\" is not a PCI address like 0000:18:00.0 (nvidia-smi "
          "--query-gpu=uuid,pci.bus_id --format=csv)",
          g.id(), g.pci_bus_id()));
    }
  }
}

void CheckHostLinks(const v1::DaemonConfig& c, Problems* p) {
  std::set<std::string> host_names, children;
  for (const auto& h : c.host_links()) {
    if (h.name().empty()) p->Add("every host link needs a name");
    if (!host_names.insert(h.name()).second) {
      p->Add("host link " + h.name() + " is configured twice");
    }
    if (h.links().empty()) p->Add("host link " + h.name() + " lists no links");
    if (!ValidCapacity(h.d2h_bytes_per_second()) || !ValidCapacity(h.h2d_bytes_per_second())) {
      p->Add(CapacityProblem("host link " + h.name(), h.d2h_bytes_per_second(),
                             h.h2d_bytes_per_second()));
    }
    for (const auto& l : h.links()) {
      if (!children.insert(l).second) p->Add("link " + l + " is under more than one host link");
    }
  }
}

}  // namespace

absl::Status ValidateConfig(const v1::DaemonConfig& c, const ConfigSources& sources) {
  Problems p{sources, {}};
  CheckRanges(c, &p);
  CheckChoicesAndPool(c, &p);
  CheckMetricsAddress(c, &p);
  CheckLinks(c, &p);
  CheckPerUidLimits(c, &p);
  p.PerUidWithinTotal(c.projector().max_queued_refreshes_per_uid(),
                      c.projector().max_queued_refreshes(),
                      "projector.max_queued_refreshes_per_uid", "projector.max_queued_refreshes");
  if (auto g = ResolveSocketGroup(c); !g.ok()) p.Add(std::string(g.status().message()));
  CheckGpus(c, &p);
  CheckHostLinks(c, &p);
  if (p.sentences.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError("invalid config: " + absl::StrJoin(p.sentences, "; "));
}

std::vector<ConfigFieldRange> ConfigFieldRanges() {
  std::vector<ConfigFieldRange> ranges;
  for (const FieldRange& r : kFieldRanges) {
    ranges.push_back({r.field, r.min, r.max, r.bounds == Bounds::kAboveMin,
                      r.bounds == Bounds::kClosedOrZero, RangeRule(r)});
  }
  return ranges;
}

// Every scalar field's flag with its help line, in the order --help lists them.
constexpr FlagInfo kFlagTable[] = {
    {"socket_path", "Unix socket path (default: docs/configuration.md, Default socket path)"},
    {"socket_mode", "socket file mode, octal (default 0660)"},
    {"pool_bytes", "host pool size, e.g. 64GiB (default 1GiB)"},
    {"pool_mlock", "true to mlock the pool"},
    {"pool_huge_pages", "true to back the pool with transparent huge pages"},
    {"pool_shm_name", "keep the pool in /dev/shm/<name> across restarts (\"\" = anonymous)"},
    {"resume_grace_seconds", "how long adopted blocks wait for their session to resume"},
    {"pool_data_checksums", "with pool_shm_name: CRC32C of each block's data, checked on restart"},
    {"spill_directory", "spill tier: directory on local NVMe (\"\" = no spill tier)"},
    {"spill_capacity_bytes", "spill tier: bytes of spill files, e.g. 500GiB; 0 = 90% of free space"},
    {"spill_bytes_per_second", "spill tier: disk rate, e.g. 3GB; 0 = measured; < 0 = unpaced"},
    {"spill_posix_io", "spill tier: pread/pwrite instead of io_uring (true|false)"},
    {"spill_high_water_fraction", "spill tier: spill above this pool fraction (0.9)"},
    {"spill_stage_ahead_blocks", "spill tier: blocks staged back ahead of each reload (2)"},
    {"spill_io_threads", "spill tier: disk chunks in flight (2)"},
    {"backend", "shm | cuda | cuda-sim (simulated GPUs: offloadd.sim_gpu clients, timing model)"},
    {"chunk_bytes", "copy chunk size, e.g. 8MiB"},
    {"copy_threads", "copy worker threads per link and direction"},
    {"async_copies", "cuda/cuda-sim: post chunks and learn completion from events (true|false)"},
    {"max_chunks_in_flight_per_gpu", "with async_copies: chunks posted per GPU and direction"},
    {"session_quota_bytes", "per-session quota, 0 = none"},
    {"admission_deadline_seconds", "how long an offload waits for pool space"},
    {"admission_queue_limit", "offloads that may wait for space at once"},
    {"metrics_address", "Prometheus host:port, empty to disable"},
    {"default_link_bytes_per_second", "simulated link rate per direction, e.g. 25GB; 0 = unpaced"},
    {"offload_min_share", "share of a link offloads keep while reloads also wait (0.2)"},
    {"sysfs_root", "sysfs tree for topology discovery (default /sys)"},
    {"numa_node_bytes_per_second", "capacity of a NUMA node's host link, e.g. 40GB; 0 = none"},
    {"numa_placement", "auto | off: pool slices per GPU NUMA node (auto: with 2+ nodes)"},
    {"socket_group", "group of the socket file (name or gid), empty = the daemon's"},
    {"allowed_uids", "comma-separated uids that may open sessions (empty = any)"},
    {"allowed_gids", "comma-separated gids that may open sessions (empty = any)"},
    {"admin_uids", "comma-separated uids that may end sessions (root always may)"},
    {"uid_quota_bytes", "pool bytes all sessions of one uid may hold, 0 = none"},
    {"max_requests_in_flight", "per-session requests not yet answered (4096), 0 = no limit"},
    {"max_sessions", "sessions open at once (1024), 0 = no limit"},
    {"max_sessions_per_uid", "sessions one non-admin uid may have open (256), 0 = no limit"},
    {"max_links", "links made for new device ids (64), 0 = no limit"},
    {"watch_client_pids", "end a session whose process exited though its stream is open"},
    {"pid_exit_grace_seconds", "delay before such a session ends (2)"},
    {"hello_timeout_seconds", "end a session stream with no Hello after this long (10), 0 = never"},
    {"max_pending_hello_streams_total", "streams awaiting Hello in all (4096), 0 = no limit"},
    {"max_pending_hello_streams_per_uid", "streams awaiting Hello per uid (256), 0 = no limit"},
    {"max_streams_per_connection", "calls open at once on one connection (64)"},
    {"keepalive_time_seconds", "ping each client connection this often (60), 0 = never"},
    {"keepalive_timeout_seconds", "close a connection whose ping is unanswered this long (60)"},
    {"ring_poll_seconds", "request rings: poll interval after work, clients skip wakes (0.0005)"},
    {"shutdown_grace_seconds", "SIGTERM: how long queued copies may finish (10), 0 = no bound"},
    {"link_calibration", "cuda/cuda-sim: measure links without a capacity at start-up (true)"},
    {"link_calibration_budget_seconds", "time one link calibration may take in all (5)"},
    {"max_shm_mappings_total", "client shm regions mapped at once in all (16384)"},
    {"max_shm_mappings_per_uid", "client shm regions mapped at once per uid (4096)"},
    {"max_shm_mapped_bytes_total", "bytes of client shm mapped at once in all (256GiB)"},
    {"max_shm_mapped_bytes_per_uid", "bytes of client shm mapped at once per uid (64GiB)"},
    {"max_connections_total", "socket connections open at once (4096)"},
    {"max_connections_per_uid", "socket connections one non-admin uid may hold (512)"},
    {"admin_reserved_connections", "connections kept for admins beyond the total (32)"},
    {"unused_connection_timeout_seconds", "close a connection that makes no call (30)"},
};

const std::vector<FlagInfo>& ConfigFlags() {
  static const std::vector<FlagInfo>* flags =
      new std::vector<FlagInfo>(std::begin(kFlagTable), std::end(kFlagTable));
  return *flags;
}

namespace {

// The size suffixes and their multipliers, longest first.
constexpr std::pair<const char*, uint64_t> kSizeSuffixes[] = {
    {"TiB", 1ull << 40}, {"GiB", 1ull << 30}, {"MiB", 1ull << 20}, {"KiB", 1ull << 10},
    {"TB", 1000000000000ull}, {"GB", 1000000000ull}, {"MB", 1000000ull}, {"KB", 1000ull},
    {"B", 1}};

// `text` without its size suffix, and the suffix's multiplier (1 without one).
std::pair<std::string, uint64_t> SplitSizeSuffix(const std::string& text) {
  std::string t(absl::StripAsciiWhitespace(text));
  for (const auto& [suffix, multiplier] : kSizeSuffixes) {
    if (absl::EndsWith(t, suffix) && t.size() > strlen(suffix)) {
      return {t.substr(0, t.size() - strlen(suffix)), multiplier};
    }
  }
  return {t, 1};
}

absl::Status TooManyBytes(const std::string& text) {
  return absl::OutOfRangeError(absl::StrFormat(
      "\"%s\" is more bytes than a 64-bit count holds (at most 18446744073709551615, 16 EiB): "
      "give a smaller size",
      text));
}

absl::Status NotASize(const std::string& text) {
  return absl::InvalidArgumentError(absl::StrFormat(
      "\"%s\" is not a size: write a whole number of bytes in decimal digits, optionally with a "
      "suffix (KiB MiB GiB TiB KB MB GB TB; 64MiB, 1.5GiB)",
      text));
}

}  // namespace

namespace {

// ParseBytes; `*part_byte` (when given) says whether `text` was refused for coming to a
// fraction of a byte (1.3KiB is 1331.2 bytes), `*below` then the whole bytes below it.
absl::StatusOr<uint64_t> ReadBytes(const std::string& text, bool* part_byte, uint64_t* below) {
  const auto [number, multiplier] = SplitSizeSuffix(text);
  const size_t dot = number.find('.');
  const std::string whole = number.substr(0, dot);
  std::string fraction = dot == std::string::npos ? "" : number.substr(dot + 1);
  // A fraction only with a suffix that makes it whole bytes (1.5GiB); never 0x, signs, exponents.
  if (!IsDecimalWhole(whole)) return NotASize(text);
  if (dot != std::string::npos &&
      (multiplier == 1 || fraction.empty() ||
       fraction.find_first_not_of("0123456789") != std::string::npos)) {
    return NotASize(text);
  }
  while (!fraction.empty() && fraction.back() == '0') fraction.pop_back();
  if (whole.size() > 20) return TooManyBytes(text);
  if (fraction.size() > 19) return NotASize(text);  // finer than any suffix's byte
  unsigned __int128 scale = 1, fraction_value = 0;
  for (char ch : fraction) {
    scale *= 10;
    fraction_value = fraction_value * 10 + static_cast<unsigned>(ch - '0');
  }
  uint64_t whole_value = 0;
  if (!absl::SimpleAtoi(whole, &whole_value)) return TooManyBytes(text);  // 20 digits, > 2^64
  const unsigned __int128 fraction_bytes = fraction_value * multiplier;
  const unsigned __int128 bytes =
      static_cast<unsigned __int128>(whole_value) * multiplier + fraction_bytes / scale;
  if (bytes > std::numeric_limits<uint64_t>::max()) return TooManyBytes(text);
  if (fraction_bytes % scale != 0) {  // not a whole number of bytes
    if (part_byte != nullptr) *part_byte = true;
    if (below != nullptr) *below = static_cast<uint64_t>(bytes);
    return NotASize(text);
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace

absl::StatusOr<uint64_t> ParseBytes(const std::string& text) {
  return ReadBytes(text, nullptr, nullptr);
}

namespace {

// A rate in bytes per second: a real number (RealNumberLength's form: 2.5e10, -1, 0.4),
// optionally with a size suffix (25GB, 1e3GB), kept as given (not rounded: 0.4 stays 0.4, not
// 0, which means "unpaced" or "measure"). Errors: INVALID_ARGUMENT for any other form,
// spaces included, or a value beyond a finite double.
absl::StatusOr<double> ParseRate(const std::string& text) {
  const auto [t, multiplier] = SplitSizeSuffix(text);
  double v = 0;
  if (t.empty() || RealNumberLength(t) != t.size() || !absl::SimpleAtod(t, &v) ||
      !std::isfinite(v * static_cast<double>(multiplier))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "\"%s\" is not a rate: write bytes per second, optionally with a suffix (25GB, 2.5e10)",
        text));
  }
  return v * static_cast<double>(multiplier);
}

}  // namespace

namespace {

// How a flag's text becomes its DaemonConfig field (the field has the flag's name).
enum class FlagValue {
  kText,         // the text as is
  kOctal,        // a file mode, octal
  kBool,         // true|1|(empty) or false|0
  kBytes,        // ParseBytes; into a uint64 or double field
  kRate,         // ParseRate into a double field
  kNumber,       // a real number into a double field; into a whole-number field as kCount
  kCount,        // a whole number in decimal digits into a uint32 or uint64 field
  kIds,          // comma-separated numeric ids, replacing the repeated field
};

const std::map<std::string, FlagValue>& FlagValues() {
  using V = FlagValue;
  static const auto* values = new std::map<std::string, FlagValue>{
      {"socket_path", V::kText}, {"socket_mode", V::kOctal}, {"pool_bytes", V::kBytes},
      {"pool_mlock", V::kBool}, {"pool_huge_pages", V::kBool}, {"pool_shm_name", V::kText},
      {"resume_grace_seconds", V::kNumber}, {"pool_data_checksums", V::kBool},
      {"spill_directory", V::kText},
      {"spill_capacity_bytes", V::kBytes}, {"spill_bytes_per_second", V::kRate},
      {"spill_posix_io", V::kBool}, {"spill_high_water_fraction", V::kNumber},
      {"spill_stage_ahead_blocks", V::kNumber}, {"spill_io_threads", V::kNumber},
      {"backend", V::kText}, {"chunk_bytes", V::kBytes}, {"session_quota_bytes", V::kBytes},
      {"async_copies", V::kBool}, {"max_chunks_in_flight_per_gpu", V::kNumber},
      {"copy_threads", V::kNumber}, {"admission_deadline_seconds", V::kNumber},
      {"admission_queue_limit", V::kNumber}, {"metrics_address", V::kText},
      {"default_link_bytes_per_second", V::kRate}, {"numa_node_bytes_per_second", V::kRate},
      {"offload_min_share", V::kNumber}, {"sysfs_root", V::kText}, {"numa_placement", V::kText},
      {"socket_group", V::kText},
      {"allowed_uids", V::kIds}, {"allowed_gids", V::kIds}, {"admin_uids", V::kIds},
      {"uid_quota_bytes", V::kBytes}, {"max_requests_in_flight", V::kCount},
      {"max_sessions", V::kCount}, {"max_sessions_per_uid", V::kCount}, {"max_links", V::kCount},
      {"hello_timeout_seconds", V::kNumber}, {"shutdown_grace_seconds", V::kNumber},
      {"max_pending_hello_streams_total", V::kCount},
      {"max_pending_hello_streams_per_uid", V::kCount},
      {"max_streams_per_connection", V::kCount}, {"watch_client_pids", V::kBool},
      {"pid_exit_grace_seconds", V::kNumber}, {"keepalive_time_seconds", V::kNumber},
      {"keepalive_timeout_seconds", V::kNumber}, {"ring_poll_seconds", V::kNumber},
      {"link_calibration", V::kBool},
      {"link_calibration_budget_seconds", V::kNumber},
      {"max_shm_mappings_total", V::kCount}, {"max_shm_mappings_per_uid", V::kCount},
      {"max_shm_mapped_bytes_total", V::kBytes}, {"max_shm_mapped_bytes_per_uid", V::kBytes},
      {"max_connections_total", V::kCount}, {"max_connections_per_uid", V::kCount},
      {"admin_reserved_connections", V::kCount},
      {"unused_connection_timeout_seconds", V::kNumber},
  };
  return *values;
}

// Applies one flag of a known field; `name` is the normalized flag (and field) name.
class FlagSetter {
 public:
  FlagSetter(const std::string& name, const std::string& value, v1::DaemonConfig* c)
      : name_(name), value_(value), c_(c),
        field_(v1::DaemonConfig::descriptor()->FindFieldByName(name)),
        reflection_(c->GetReflection()) {}

  absl::Status Apply(FlagValue kind) {
    const bool real = field_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE;
    // A value is taken as written: no flag strips spaces around a number, a mode or true/false
    // (a list's entries may have spaces around their commas).
    if (kind != FlagValue::kText && kind != FlagValue::kIds &&
        absl::StripAsciiWhitespace(value_) != value_) {
      return Refuse("must be written without spaces before or after the value");
    }
    switch (kind) {
      case FlagValue::kText: reflection_->SetString(c_, field_, value_); return absl::OkStatus();
      case FlagValue::kOctal: return Octal();
      case FlagValue::kBool: return Bool();
      case FlagValue::kBytes: return Bytes();
      case FlagValue::kRate: return Rate();
      case FlagValue::kNumber: return real ? Real() : Count();
      case FlagValue::kCount: return Count();
      case FlagValue::kIds: return Ids();
    }
    return absl::InternalError("unhandled flag kind");
  }

 private:
  // "<field> <rule> (got "<value>" from --<field>=<value> on the command line)": the form of
  // ValidateConfig's range errors.
  absl::Status Refuse(const std::string& rule) const {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s %s (got \"%s\" from --%s=%s on the command line)", name_, rule, value_, name_,
        value_));
  }
  absl::Status Bool() {
    if (value_ == "true" || value_ == "1" || value_.empty()) {
      reflection_->SetBool(c_, field_, true);
    } else if (value_ == "false" || value_ == "0") {
      reflection_->SetBool(c_, field_, false);
    } else {
      return Refuse("must be \"true\" or \"false\" (or 1 or 0; --" + name_ + " alone is true)");
    }
    return absl::OkStatus();
  }
  // The value with the spaces or tabs between its number and its suffix taken out, as the
  // config file reads "64 GiB" (--pool_bytes="64 GiB" is 64GiB); as written otherwise.
  std::string Unspaced(bool rate) const {
    if (SizedValueLength(value_, rate) != value_.size()) return value_;
    std::string value = value_;
    value.erase(std::remove_if(value.begin(), value.end(),
                               [](char ch) { return ch == ' ' || ch == '\t'; }),
                value.end());
    return value;
  }
  // A size (ParseBytes) into a uint64 field.
  absl::Status Bytes() {
    bool part_byte = false;
    uint64_t below = 0;
    absl::StatusOr<uint64_t> b = ReadBytes(Unspaced(/*rate=*/false), &part_byte, &below);
    if (part_byte) return Refuse(PartByteRule(value_, below));
    if (!b.ok()) {
      return Refuse(b.status().code() == absl::StatusCode::kOutOfRange ? kTooManyBytesRule
                                                                        : kSizeRule);
    }
    reflection_->SetUInt64(c_, field_, *b);
    return absl::OkStatus();
  }
  // A rate (ParseRate) into a double field; its range is ValidateConfig's to check.
  absl::Status Rate() {
    absl::StatusOr<double> r = ParseRate(Unspaced(/*rate=*/true));
    if (!r.ok()) {
      return Refuse(kRateRule);
    }
    reflection_->SetDouble(c_, field_, *r);
    return absl::OkStatus();
  }
  // A file mode: 1 to 4 octal digits, at most 0777 (strtoul would read "0999" as 0).
  absl::Status Octal() {
    if (value_.empty() || value_.size() > 4 ||
        value_.find_first_not_of("01234567") != std::string::npos ||
        std::strtoul(value_.c_str(), nullptr, 8) > kMaxSocketMode) {
      return Refuse(absl::StrFormat("must be an octal file mode from 0000 to %04o, like 0660",
                                    kMaxSocketMode));
    }
    reflection_->SetUInt32(c_, field_,
                           static_cast<uint32_t>(std::strtoul(value_.c_str(), nullptr, 8)));
    return absl::OkStatus();
  }
  // A real number into a double field.
  absl::Status Real() {
    double d = 0;
    if (!absl::SimpleAtod(value_, &d)) return Refuse("must be a number, like 2.5 or 1e-3");
    reflection_->SetDouble(c_, field_, d);
    return absl::OkStatus();
  }
  // A whole number into a uint32 or uint64 field: decimal digits (IsDecimalWhole), within the
  // field's type (4294967297 became 1 in a uint32); the range kFieldRanges gives is
  // ValidateConfig's to check, naming the source.
  absl::Status Count() {
    const uint64_t max = MaxOf(field_);
    uint64_t v = 0;
    if (!IsDecimalWhole(value_) || !absl::SimpleAtoi(value_, &v) || v > max) {
      return Refuse(WholeNumberRule(name_, max));
    }
    if (field_->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_UINT64) {
      reflection_->SetUInt64(c_, field_, v);
    } else {
      reflection_->SetUInt32(c_, field_, static_cast<uint32_t>(v));
    }
    return absl::OkStatus();
  }
  // Comma-separated ids replacing the list; an empty value empties it, an empty entry ("," or
  // "1000,,1001") is refused (it read as no id, so "," emptied the list: anyone).
  absl::Status Ids() {
    std::vector<uint32_t> ids;
    std::vector<absl::string_view> parts;
    if (!value_.empty()) parts = absl::StrSplit(value_, ',');
    for (absl::string_view part : parts) {
      part = absl::StripAsciiWhitespace(part);
      if (part.empty()) {
        return Refuse(absl::StrFormat(
            "has an empty entry: give ids separated by single commas, like 1000,1001 (an empty "
            "value, --%s=, empties the list)",
            name_));
      }
      uint32_t id;
      if (!IsDecimalWhole(part) || !absl::SimpleAtoi(part, &id)) {
        return Refuse("must be numeric ids from 0 to 4294967295 in decimal digits, "
                      "comma-separated, like 1000,1001");
      }
      ids.push_back(id);
    }
    reflection_->ClearField(c_, field_);
    for (uint32_t id : ids) reflection_->AddUInt32(c_, field_, id);
    return absl::OkStatus();
  }

  const std::string& name_;
  const std::string& value_;
  v1::DaemonConfig* c_;
  const google::protobuf::FieldDescriptor* field_;
  const google::protobuf::Reflection* reflection_;
};

}  // namespace

namespace {

// Edit distance between two flag names (insertions, deletions, substitutions).
size_t EditDistance(absl::string_view a, absl::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// " (did you mean --a or --b?)" for an unknown flag `name`: the flags within 2 edits of it,
// else those of its first word (--pool_size: the pool_ flags); "" when none is near.
std::string FlagSuggestion(const std::string& name) {
  std::vector<std::string> near, same_word;
  const std::string word = name.substr(0, name.find('_')) + "_";
  for (const auto& [flag, kind] : FlagValues()) {
    if (EditDistance(name, flag) <= 2) near.push_back("--" + flag);
    if (absl::StartsWith(flag, word)) same_word.push_back("--" + flag);
  }
  const std::vector<std::string>& pick = near.empty() ? same_word : near;
  if (pick.empty() || pick.size() > 6) return "";
  return absl::StrCat(" (did you mean ", absl::StrJoin(pick, ", "), "?)");
}

}  // namespace

absl::Status ApplyFlag(const std::string& raw_name, const std::string& value,
                       v1::DaemonConfig* c) {
  std::string name = raw_name;
  for (char& ch : name) ch = ch == '-' ? '_' : ch;
  const auto kind = FlagValues().find(name);
  if (kind == FlagValues().end()) {
    return absl::NotFoundError("unknown flag --" + raw_name + FlagSuggestion(name) +
                               " (offloadd --help lists them)");
  }
  return FlagSetter(name, value, c).Apply(kind->second);
}

namespace {

// The fields the config text at `path` names, top level and one level of nesting
// ("cuda_sim.gpus"); empty when it does not read or parse (LoadConfigFile says why).
std::set<std::string> FieldsNamedIn(const std::string& path) {
  std::set<std::string> named;
  absl::StatusOr<std::string> text =
      base::ReadBoundedFile(path, kMaxConfigFileBytes, "config file");
  if (!text.ok()) return named;
  v1::DaemonConfig scratch;
  google::protobuf::TextFormat::Parser parser;
  google::protobuf::TextFormat::ParseInfoTree tree;
  parser.WriteLocationsTo(&tree);
  parser.AllowPartialMessage(true);
  Collector ignored;  // not logged: LoadConfigFile has said why a file does not parse
  parser.RecordErrorsTo(&ignored);
  if (!parser.ParseFromString(ExpandSizeSuffixes(*text), &scratch)) return named;
  const google::protobuf::Descriptor* d = v1::DaemonConfig::descriptor();
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    const int index = f->is_repeated() ? 0 : -1;
    if (tree.GetLocation(f, index).line < 0) continue;
    named.insert(f->name());
    const google::protobuf::TextFormat::ParseInfoTree* nested = tree.GetTreeForNested(f, index);
    if (nested == nullptr || f->message_type() == nullptr) continue;
    for (int j = 0; j < f->message_type()->field_count(); ++j) {
      const google::protobuf::FieldDescriptor* g = f->message_type()->field(j);
      if (nested->GetLocation(g, g->is_repeated() ? 0 : -1).line >= 0) {
        named.insert(f->name() + "." + g->name());
      }
    }
  }
  return named;
}

}  // namespace

absl::StatusOr<v1::DaemonConfig> LoadDaemonConfig(const ConfigSources& sources) {
  absl::StatusOr<v1::DaemonConfig> config =
      sources.file.empty() ? ParseConfig("") : LoadConfigFile(sources.file);
  if (!config.ok()) return config.status();
  for (const auto& [name, value] : sources.flags) {
    if (absl::Status st = ApplyFlag(name, value, &*config); !st.ok()) return st;
  }
  absl::Status st = ValidateConfig(*config, sources);
  if (st.ok()) return config;
  if (sources.file.empty() || sources.file_fields) return st;
  // Only an invalid config reads the file's field names (for its messages' sources).
  ConfigSources known = sources;
  known.file_fields = FieldsNamedIn(known.file);
  return ValidateConfig(*config, known);
}

absl::StatusOr<CheckedConfig> LoadConfigToCheck(const ConfigSources& sources) {
  absl::StatusOr<v1::DaemonConfig> config = LoadDaemonConfig(sources);
  if (!config.ok()) return config.status();
  const std::string file = sources.file.empty() ? "the defaults" : sources.file;
  if (sources.flags.empty()) return CheckedConfig{*std::move(config), file};
  std::vector<std::string> flags;
  for (const auto& [name, value] : sources.flags) flags.push_back("--" + name + "=" + value);
  const std::string given = absl::StrJoin(flags, " ");
  CheckedConfig checked{*std::move(config),
                        absl::StrFormat("%s with %s from the command line", file, given), ""};
  absl::StatusOr<v1::DaemonConfig> alone = LoadDaemonConfig({sources.file, {}});
  if (!alone.ok()) {
    checked.note = absl::StrFormat(
        "%s alone is not valid (%s); it is valid only with the command-line flags given (%s): "
        "a daemon started from the file without those flags refuses it, so fix the file or "
        "always start the daemon with the same flags",
        file, alone.status().message(), given);
  }
  return checked;
}

copy::ShmMappingLimits ToShmMappingLimits(const v1::DaemonConfig& config) {
  copy::ShmMappingLimits l;
  l.max_mappings_total = config.max_shm_mappings_total();
  l.max_mappings_per_uid = config.max_shm_mappings_per_uid();
  l.max_mapped_bytes_total = config.max_shm_mapped_bytes_total();
  l.max_mapped_bytes_per_uid = config.max_shm_mapped_bytes_per_uid();
  return l;
}

std::string ResolveSocketPath(const v1::DaemonConfig& config) {
  std::string path =
      config.socket_path().empty() ? client::DefaultSocketPath() : config.socket_path();
  if (!path.empty() && path[0] != '/') {
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr) path = absl::StrCat(cwd, "/", path);
  }
  return path;
}

absl::StatusOr<int64_t> ResolveSocketGroup(const v1::DaemonConfig& config) {
  const std::string& g = config.socket_group();
  if (g.empty()) return -1;
  uint32_t gid;
  if (absl::SimpleAtoi(g, &gid)) return static_cast<int64_t>(gid);
  group grp;
  group* found = nullptr;
  std::vector<char> buf(16384);
  if (getgrnam_r(g.c_str(), &grp, buf.data(), buf.size(), &found) != 0 || found == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket_group \"%s\" is not a group on this machine: create it (groupadd %s) or give a "
        "numeric gid",
        g, g));
  }
  return static_cast<int64_t>(found->gr_gid);
}

namespace {

// Everything but the links and host links.
session::CoreOptions BaseCoreOptions(const v1::DaemonConfig& c) {
  session::CoreOptions o;
  o.backend_label = c.backend();
  o.chunk_bytes = c.chunk_bytes();
  o.copy_threads = c.copy_threads();
  if (c.max_chunks_in_flight_per_gpu() > 0) {
    o.max_chunks_in_flight_per_gpu = c.max_chunks_in_flight_per_gpu();
  }
  o.store.session_quota_bytes = c.session_quota_bytes();
  o.store.admission_deadline_seconds = c.admission_deadline_seconds();
  o.store.admission_queue_limit = c.admission_queue_limit();
  o.store.uid_quota_bytes = c.uid_quota_bytes();
  o.store.spill_high_water_fraction = c.spill_high_water_fraction();
  o.store.stage_ahead_blocks = c.spill_stage_ahead_blocks();
  o.spill.directory = c.spill_directory();
  o.spill.capacity_bytes = c.spill_capacity_bytes();
  o.spill.bytes_per_second = c.spill_bytes_per_second();
  o.spill.io_uring = !c.spill_posix_io();
  o.spill.io_threads = c.spill_io_threads();
  o.spill.chunk_bytes = c.chunk_bytes();
  o.spill.spill_min_share = c.offload_min_share();
  o.access.allowed_uids.assign(c.allowed_uids().begin(), c.allowed_uids().end());
  o.access.allowed_gids.assign(c.allowed_gids().begin(), c.allowed_gids().end());
  o.access.admin_uids.assign(c.admin_uids().begin(), c.admin_uids().end());
  o.max_requests_in_flight = c.max_requests_in_flight();
  o.max_sessions = c.max_sessions();
  o.max_sessions_per_uid = c.max_sessions_per_uid();
  o.max_links = c.max_links();
  o.connections.max_connections_total = c.max_connections_total();
  o.connections.max_connections_per_uid = c.max_connections_per_uid();
  o.connections.admin_reserved_connections = c.admin_reserved_connections();
  o.connections.unused_connection_timeout_seconds = c.unused_connection_timeout_seconds();
  o.connections.max_streams_per_connection = c.max_streams_per_connection();
  o.connections.keepalive_time_seconds = c.keepalive_time_seconds();
  o.connections.keepalive_timeout_seconds = c.keepalive_timeout_seconds();
  o.max_pending_hello_total = c.max_pending_hello_streams_total();
  o.max_pending_hello_per_uid = c.max_pending_hello_streams_per_uid();
  o.hello_timeout_seconds = c.hello_timeout_seconds();
  o.shutdown_grace_seconds = c.shutdown_grace_seconds();
  o.watch_pids = c.watch_client_pids();
  o.pid_exit_grace_seconds = c.pid_exit_grace_seconds();
  o.resume_grace_seconds = c.resume_grace_seconds();
  o.ring_poll_seconds = c.ring_poll_seconds();
  o.pool_data_checksums = c.pool_data_checksums();
  o.default_link_bytes_per_second = c.default_link_bytes_per_second();
  o.link_calibration.at_start =
      c.link_calibration() && (c.backend() == "cuda" || c.backend() == "cuda-sim");
  o.link_calibration.budget_seconds = c.link_calibration_budget_seconds();
  o.offload_min_share = c.offload_min_share();
  for (const auto& w : c.gpu_weights()) o.gpu_weights[w.gpu()] = w.weight();
  for (const auto& h : c.host_links()) {
    session::HostLinkSpec spec;
    spec.name = h.name();
    spec.links.assign(h.links().begin(), h.links().end());
    spec.d2h_bytes_per_second = h.d2h_bytes_per_second();
    spec.h2d_bytes_per_second = h.h2d_bytes_per_second();
    o.host_links.push_back(std::move(spec));
  }
  return o;
}

bool HalfDuplex(const v1::DaemonConfig& c, const std::string& link) {
  for (const auto& l : c.links()) {
    if (l.name() == link) return l.half_duplex();
  }
  return false;
}

}  // namespace

session::CoreOptions ToCoreOptions(const v1::DaemonConfig& c) {
  session::CoreOptions o = BaseCoreOptions(c);
  for (const auto& l : c.links()) {
    session::LinkSpec spec;
    spec.name = l.name();
    spec.gpus.assign(l.gpus().begin(), l.gpus().end());
    spec.d2h_bytes_per_second = l.d2h_bytes_per_second();
    spec.h2d_bytes_per_second = l.h2d_bytes_per_second();
    spec.half_duplex = l.half_duplex();
    o.links.push_back(std::move(spec));
  }
  return o;
}

std::vector<sched::GpuPci> ConfiguredGpuAddresses(const v1::DaemonConfig& c) {
  std::vector<sched::GpuPci> gpus;
  for (const auto& g : c.gpus()) gpus.push_back({g.id(), g.pci_bus_id()});
  return gpus;
}

copy::SimCudaOptions ToSimCudaOptions(const v1::DaemonConfig& c) {
  copy::SimCudaOptions o;
  o.model.gpus = static_cast<int>(c.cuda_sim().gpus());
  o.model.gpus_per_switch = static_cast<int>(c.cuda_sim().gpus_per_switch());
  o.model.engine_bytes_per_second = c.cuda_sim().engine_bytes_per_second();
  o.model.switch_bytes_per_second = c.cuda_sim().switch_bytes_per_second();
  return o;
}

sched::Topology SimulatedTopology(const v1::DaemonConfig& c) {
  sched::Topology t;
  const v1::CudaSimConfig& s = c.cuda_sim();
  if (s.switch_bytes_per_second() <= 0 || s.gpus_per_switch() < 1) return t;
  for (uint32_t g = 0; g < s.gpus(); ++g) {
    const std::string name = absl::StrCat("sim-switch", g / s.gpus_per_switch());
    if (t.links.empty() || t.links.back().name != name) {
      sched::TopologyLink link;
      link.name = name;
      t.links.push_back(std::move(link));
    }
    sched::TopologyGpu gpu;
    gpu.gpu = copy::SimCudaApi::DeviceUuid(static_cast<int>(g));
    gpu.bdf = absl::StrFormat("0000:%02x:00.0", 0x10 + g);  // as SimCudaApi lists it
    gpu.link = name;
    t.links.back().gpus.push_back(gpu.gpu);
    t.gpus.push_back(std::move(gpu));
  }
  return t;
}

absl::StatusOr<sched::Topology> ResolveTopology(const v1::DaemonConfig& c,
                                                const std::vector<sched::GpuPci>& gpus) {
  sched::Topology topology;
  if (c.backend() == "cuda-sim") {
    topology = SimulatedTopology(c);  // the model's switches; `gpus` name no simulated GPU
  } else if (!gpus.empty()) {
    auto discovered = sched::DiscoverTopology(c.sysfs_root(), gpus);
    if (!discovered.ok()) {
      return absl::Status(discovered.status().code(),
                          absl::StrCat("topology: ", discovered.status().message()));
    }
    topology = *std::move(discovered);
  }
  std::vector<sched::LinkOverride> overrides;
  for (const auto& l : c.links()) {
    sched::LinkOverride o;
    o.name = l.name();
    o.gpus.assign(l.gpus().begin(), l.gpus().end());
    o.d2h_bytes_per_second = l.d2h_bytes_per_second();
    o.h2d_bytes_per_second = l.h2d_bytes_per_second();
    overrides.push_back(std::move(o));
  }
  auto resolved = sched::ApplyLinkOverrides(std::move(topology), overrides);
  if (!resolved.ok()) {
    return absl::Status(resolved.status().code(),
                        absl::StrCat("topology: ", resolved.status().message()));
  }
  sched::AssumeSingleNumaNode(sched::SingleOnlineNumaNode(c.sysfs_root()), &*resolved);
  return resolved;
}

std::vector<int> PoolNumaNodes(const v1::DaemonConfig& c, const sched::Topology& topology,
                               const std::function<bool(int)>& may_allocate_on,
                               std::vector<int>* unusable) {
  if (c.numa_placement() == "off") return {};
  std::vector<int> nodes;
  for (int node : sched::GpuNumaNodes(topology)) {
    if (may_allocate_on(node)) {
      nodes.push_back(node);
    } else if (unusable != nullptr) {
      unusable->push_back(node);
    }
  }
  if (nodes.size() < 2) return {};
  return nodes;
}

session::CoreOptions ToCoreOptions(const v1::DaemonConfig& c, const sched::Topology& topology) {
  session::CoreOptions o = BaseCoreOptions(c);
  std::set<std::string> under_host;
  for (const session::HostLinkSpec& h : o.host_links) {
    under_host.insert(h.links.begin(), h.links.end());
  }
  std::map<int, session::HostLinkSpec> numa;
  for (const sched::TopologyLink& l : topology.links) {
    session::LinkSpec spec;
    spec.name = l.name;
    spec.gpus = l.gpus;
    spec.d2h_bytes_per_second = l.d2h_bytes_per_second;
    spec.h2d_bytes_per_second = l.h2d_bytes_per_second;
    spec.half_duplex = HalfDuplex(c, l.name);
    spec.uplink_bdf = l.uplink_bdf;
    spec.root_port = l.root_port;
    spec.numa_node = l.numa_node;
    spec.pcie_bytes_per_second = l.pcie_bytes_per_second;
    o.links.push_back(std::move(spec));
    if (c.numa_node_bytes_per_second() > 0 && l.numa_node >= 0 && !under_host.count(l.name)) {
      session::HostLinkSpec& h = numa[l.numa_node];
      h.name = absl::StrCat("numa", l.numa_node);
      h.links.push_back(l.name);
      h.d2h_bytes_per_second = h.h2d_bytes_per_second = c.numa_node_bytes_per_second();
      h.numa_node = l.numa_node;
    }
  }
  for (auto& [node, h] : numa) o.host_links.push_back(std::move(h));
  for (const sched::TopologyGpu& g : topology.gpus) {
    if (!g.bdf.empty()) o.gpu_bus_ids[g.gpu] = g.bdf;
    if (g.numa_node >= 0) o.gpu_numa_nodes[g.gpu] = g.numa_node;
  }
  return o;
}

}  // namespace offloadd
