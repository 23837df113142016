// `offloadctl plan`: command-line front end of the capacity planner (client/plan/planner.h).
//
// Flags (each as `--flag value` or `--flag=value`):
//   model, either      --hf-config FILE   a dense Llama/Qwen-style Hugging Face config.json
//   or                 --layers N --hidden N --params-per-layer N [--attn-width N (default:
//                      hidden)]; given with --hf-config these override the derived values
//   --batch N          micro-batch b (default 1)
//   --seq N            tokens per GPU after any context-parallel split (before --tp's);
//                      suffix K = 1024,
//                      M = 1048576 ("4K", "128K"). Required unless --sweep.
//   --dtype D          checkpoint dtype bf16 | fp16 | fp32 (default bf16)
//   --gpus-per-node N  (default 8)    --gpus-per-link N (default 1)
//   --tp N             tensor-parallel degree (default 1), with Megatron sequence parallelism:
//                      each GPU holds and offloads 1/N of every checkpoint and computes 1/N of
//                      each layer (planner.h PlanInputs::tensor_parallel_size); --seq must be
//                      a multiple of N
//   --link L           a link: pcie4 | pcie5 | h200 | nvlink-c2c; a GPU, for its host link:
//                      h100 | a100 | b200 (pcie5, pcie4, pcie5) | gh200 (nvlink-c2c) | h200;
//                      or a GB/s number (default h200; planner.h gives the sources)
//   --tflops X         sustained compute rate, TFLOP/s (default 500)
//   --keep-last-n N    offloadd.torch's keep_last_n: the newest N checkpoints stay on the GPU
//                      and are not offloaded (default 1, as offloadd.torch)
//   --gpu-memory SIZE  GPU memory the run may use per GPU ("80GB", "141GB")
//   --gpu-peak SIZE    with --gpu-memory: the run's measured peak per GPU with checkpointing on
//                      and offload off (torch.cuda.max_memory_allocated()); decides whether
//                      offload is needed ("offload not needed" when it fits). Not with --sweep.
//   --sweep            table over 1K..512K tokens (or over --sweep-seqs a,b,c)
//   --json             machine-readable output (one JSON object)
//   --help
//   --host-ram SIZE    the host RAM the node can pin: pool_bytes is capped at it; when the
//                      checkpoints alone exceed it the decision is "host RAM short", no
//                      pool_bytes is printed (a sentence says what to change) and a warning
//                      goes to stderr
//   --nvme-gbps X      with --host-ram: plan the spill tier
// The text output of one plan ends with its decision line (offload / offload not needed /
// offload cannot hide the copy / offload alone does not fit / host RAM short / cannot decide,
// without --gpu-peak / nothing to offload) and the
// settings that follow: the enable() call and the daemon config line "pool_bytes: N" (bytes,
// the pinned host RAM per node with the pool allocator's headroom).
// Exit status: 0 on success; 3 when one plan does not fit: its pinned host RAM per node exceeds
// --host-ram (a --sweep only warns), its spill disk does not keep up, or offload alone does not
// bring the --gpu-peak under --gpu-memory (decision "does_not_fit") -- the warning on stderr
// says what to change; 2 for a usage error or invalid
// input (message on stderr naming the flag to fix); 1 when --hf-config cannot be read (missing,
// unreadable, not a regular file -- a FIFO or device such as /dev/zero -- or larger than
// kMaxHfConfigBytes).
#ifndef OFFLOADD_CLIENT_PLAN_PLAN_COMMAND_H_
#define OFFLOADD_CLIENT_PLAN_PLAN_COMMAND_H_

#include <cstddef>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace offloadd::plan {

// The most bytes --hf-config may hold (16 MiB; a model's config.json is a few KiB).
inline constexpr size_t kMaxHfConfigBytes = 16 << 20;

// argv[0] is the program or subcommand name and is skipped: offloadctl's main passes
// (argc - 1, argv + 1) so that argv[0] is "plan". Prints to stdout/stderr.
int RunPlanCommand(int argc, char** argv);

// Same, with the flags only (no argv[0]) and explicit streams; for tests.
int RunPlanCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err);

// A size flag's value: a positive number of bytes with an optional suffix, binary (KiB, MiB,
// GiB, TiB; also K, M, G, T) or decimal (KB, MB, GB, TB, B): "2TiB", "1536GiB", "64M", "2000GB".
// INVALID_ARGUMENT naming --`flag` and an example otherwise. Shared by offloadctl's subcommands.
absl::StatusOr<uint64_t> ParseSize(const std::string& flag, const std::string& text);

// Usage text printed by --help and after a usage error.
const char* PlanUsage();

}  // namespace offloadd::plan

#endif  // OFFLOADD_CLIENT_PLAN_PLAN_COMMAND_H_
