#!/bin/sh
# Writes the seed corpus of projector_fuzz.cc into tests/fuzz/projector_corpus: each seed is a
# list of frames "<caller> <text-format offloadd.v1.RefreshRequest>" (caller 0: uid -1, 1: uid
# 4242), encoded with protoc into the harness's [caller][2-byte length][bytes] frames.
# Region names: "b" = the 1 MiB test matrix, "a" = 64 KiB of zeros (see projector_fuzz.cc).
# Usage: sh tests/fuzz/make_projector_seeds.sh   (from the repository root)
set -eu
out=tests/fuzz/projector_corpus
mkdir -p "$out"
G='gradient_region { shm_name: "b" size_bytes: 1048576 } dtype: DTYPE_FLOAT32'
frame() {  # caller, text
  printf '%s' "$2" | protoc -I. --encode=offloadd.v1.RefreshRequest proto/projector.proto \
    > /tmp/ofd-seed.bin
  python3 -c 'import sys; d=open("/tmp/ofd-seed.bin","rb").read(); sys.stdout.buffer.write(bytes([int(sys.argv[1]), len(d) & 255, len(d) >> 8]) + d)' "$1"
}
{ frame 0 "key { parameter_id: \"w\" step: 0 } $G shape: 64 shape: 48 rank: 4 side: SIDE_STD method: METHOD_EXACT projector_offset: 524288"; } > "$out/exact_fp32"
{ frame 0 "key { parameter_id: \"w\" step: 0 } $G shape: 96 shape: 64 rank: 8 side: SIDE_LEFT method: METHOD_RANDOMIZED power_iterations: 1 projector_offset: 524288"
  frame 0 "key { parameter_id: \"w\" step: 1 } $G shape: 96 shape: 64 rank: 8 side: SIDE_LEFT method: METHOD_RANDOMIZED warm_start: true projector_offset: 524288"; } > "$out/randomized_warm_start"
{ frame 0 "key { parameter_id: \"bf\" step: 3 } gradient_region { shm_name: \"b\" size_bytes: 1048576 } dtype: DTYPE_BFLOAT16 shape: 128 shape: 64 rank: 16 side: SIDE_REVERSE_STD method: METHOD_EXACT projector_region { shm_name: \"a\" size_bytes: 65536 }"; } > "$out/bf16_projector_elsewhere"
{ frame 0 "key { parameter_id: \"huge\" step: 0 } gradient_region { shm_name: \"b\" size_bytes: 42949672960 } dtype: DTYPE_FLOAT32 shape: 100000 shape: 100000 rank: 128 side: SIDE_STD method: METHOD_EXACT projector_offset: 524288"; } > "$out/oversized_refused"
{ frame 0 "key { parameter_id: \"bad\" step: 0 } $G shape: 64 rank: 4 side: SIDE_STD method: METHOD_EXACT"
  frame 0 "key { parameter_id: \"bad\" step: 1 } $G shape: 8 shape: 8 rank: 0 side: SIDE_STD method: METHOD_EXACT"
  frame 0 "key { parameter_id: \"bad\" step: 2 } $G shape: 8 shape: 8 rank: 2 side: SIDE_STD method: METHOD_RANDOMIZED power_iterations: 1000"
  frame 0 "key { parameter_id: \"bad\" step: 3 } $G shape: 8 shape: 8 rank: 2"
  frame 0 "key { parameter_id: \"bad\" step: 4 } gradient_region { shm_name: \"a\" size_bytes: 65536 } dtype: DTYPE_FLOAT32 shape: 8 shape: 8 rank: 2 side: SIDE_STD method: METHOD_EXACT"; } > "$out/bad_inputs"
{ frame 0 "key { parameter_id: \"shared\" step: 5 } $G shape: 32 shape: 32 rank: 4 side: SIDE_STD method: METHOD_EXACT batch_id: \"b1\" projector_offset: 524288"
  frame 1 "key { parameter_id: \"shared\" step: 1000000000000000000 } $G shape: 32 shape: 32 rank: 4 side: SIDE_STD method: METHOD_EXACT batch_id: \"b1\" projector_offset: 524288"
  frame 0 "key { parameter_id: \"shared\" step: 6 } $G shape: 32 shape: 32 rank: 4 side: SIDE_STD method: METHOD_EXACT projector_offset: 524288"; } > "$out/two_uids_same_key"
{ frame 0 "key { parameter_id: \"lazy\" step: 0 } $G shape: 48 shape: 48 rank: 4 side: SIDE_STD method: METHOD_EXACT lazy: true lazy_similarity_threshold: 0.5 projector_offset: 524288"
  frame 0 "key { parameter_id: \"lazy\" step: 1 } $G shape: 48 shape: 48 rank: 4 side: SIDE_STD method: METHOD_EXACT lazy: true lazy_similarity_threshold: 0.5 projector_offset: 524288"
  frame 0 "key { parameter_id: \"lazy\" step: 0 } $G shape: 48 shape: 48 rank: 4 side: SIDE_STD method: METHOD_EXACT reset_history: true projector_offset: 524288"; } > "$out/lazy_and_reset"
rm -f /tmp/ofd-seed.bin
ls -l "$out"
