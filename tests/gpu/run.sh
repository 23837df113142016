#!/bin/bash
# offloadd GPU check: every GPU test and probe from the bundle made by `make gpu-bundle`
# (deploy/make_gpu_bundle.sh), each figure as a "FIGURE ..." line, under one global deadline.
#
#   gpu-bundle/run.sh        # from anywhere; logs and figures.txt under $OUT (else /tmp/...)
#
# Time: GPU_CHECK_DEADLINE_S (default 546 s) for everything; GPU_CHECK_BUDGET_SCALE
# (percent, default 100, at most 10000; leading zeros ignored: 08 is 8) stretches every budget and the default deadline on a slow
# host; a scaled budget is at least 1 s, and the default deadline at least their sum plus the
# reserve. GPU_CHECK_DEADLINE_S is at most 86400. Each step has a budget
# (the table printed first; the budgets add up to less than the deadline by construction) and
# runs under `timeout` of it; a step whose budget no longer fits before the deadline is not run
# ("NOT RUN (budget)"). The daemon gets SIGTERM at the end and SIGKILL (a failure) if it has not
# exited GPU_CHECK_STOP_GRACE_S (default 10, 1 to 600) seconds later; an EXIT trap stops it on any
# other way out.
#
# Rerun a few steps: GPU_CHECK_ONLY="torch_on,galore" (names as the budget table prints them,
# commas or any whitespace between; unset or empty: every step) runs only those steps and what
# they need (the NEEDS table below): the environment section always; the kernels check (it finds
# out whether the GPU is usable) and the IPC probe (it picks the daemon's backend) before a step
# on the GPU or the daemon; the daemon's start and stop around a step that talks to it; the
# Python set-up (python_warm, python_env) before a Python step; free_mid before health1. The
# deadline then defaults to the sum of their budgets plus a 30 s reserve. Unknown names, or
# separators and no name, exit 2 at once, naming the steps. A chosen step that does not run
# prints "NOT RUN" and why, and counts. A run in which a chosen step failed or did not run
# prints, before its RESULT line, the command that reruns just those:
#   RERUN the failed and not-run steps (133 s by the budgets): GPU_CHECK_ONLY=torch_on bash gpu-bundle/run.sh
#
# Order: environment (kernel, sandbox, driver, memory), fake-based unit tests, kernels, a
# cross-process CUDA IPC probe (without IPC, "IPC unsupported in this sandbox" and every step
# that needs it is NOT RUN, the torch checks then run against an shm daemon), calibration of
# the copy timing model, Python and its packages (torch is imported in the background from the
# start, so its cold first import is not paid inside a check's budget), the daemon (cuda backend, pool sized from MemAvailable), its probes
# (context cost, two clients, rates vs cudaMemcpyAsync, urgent reloads under saturation,
# ordering, an offload behind a spin kernel, a client that frees memory mid-transfer and one
# killed with copies in flight, then a health run on the same daemon), the Python probes
# (sticky CUDA errors, memory back after empty_cache, expandable segments switched at run time),
# torch_check.py and transformers_check.py with expandable segments off and on, step_timing.py
# (offloadd's cost per step against checkpointing alone, torch's save_on_cpu and an in-process
# side-stream offloader on the Qwen3 seed model, interleaved), compiled_check.py
# (torch's compiled offload pass and CUDA graph capture of a checkpointed block, reported), a last health
# run, the handle count and a clean stop.
#
# A check that prints SKIPPED while nvidia-smi lists a GPU fails the run (a driver older than the
# bundle's CUDA runtime does that to every binary: the run then goes on with the Python checks
# only, on an shm daemon, so the versions and the torch figures still come back). Without a CUDA driver
# (a build machine) the unit tests run and the script ends "SKIPPED: no usable CUDA driver/GPU
# here; nothing else to run (unit tests above ran)", exit 0; a GPU_CHECK_ONLY run ends instead
# "SKIPPED: no usable CUDA driver/GPU here, so these chosen steps did not run: ...", naming
# them, exit 2. Either then prints the RERUN line (a full run's names the failed unit tests, a
# GPU_CHECK_ONLY run's every chosen step that failed or did not run) and a RESULT line.
# Exit: 0 all ran and passed (or a full run without a driver); 1 any failure; 2 no failure but
# steps not run (IPC unsupported, budget, no driver in a GPU_CHECK_ONLY run), or nothing run: no
# bundle (bin/) beside the script, or a bad GPU_CHECK_ONLY, GPU_CHECK_BUDGET_SCALE or
# GPU_CHECK_DEADLINE_S.
#
# The bundle: bin/ (our binaries), lib/ (the shared libraries they load except libcuda and glibc;
# put on their command lines only, never exported to Python), wheel/ (the client's wheel, made
# by `make wheel` with the stubs of Debian's protoc: pip installs it with --no-deps, offline, into
# $OUT/site, which goes on the Python steps' path), python/ (the client's examples; the client
# package itself only in a bundle made without the wheel),
# pydeps/ (grpcio/protobuf wheels, used only when the machine's python3 lacks them), the check
# scripts and MANIFEST.
set -u
start_s=$(date +%s)
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -d "$here/bin" ]; then
  echo "run.sh: no bin/ beside $here: this script runs from the GPU bundle: build it with" \
    "\`make gpu-bundle\` and run gpu-bundle/run.sh" >&2
  exit 2
fi
SCALE=${GPU_CHECK_BUDGET_SCALE:-100}  # percent: every budget and the default deadline (slow hosts)
# Whole numbers only, within bounds that keep bash's arithmetic far from overflowing.
# Leading zeros are dropped (08 is 8 percent: decimal, never octal as bash would read it).
if ! [[ $SCALE =~ ^0*([1-9][0-9]*)$ ]]; then
  echo "run.sh: GPU_CHECK_BUDGET_SCALE='$SCALE' is no positive whole number of percent" \
    "(100: the budgets as they are, 200: twice as long)" >&2
  exit 2
fi
SCALE=${BASH_REMATCH[1]}
if [ ${#SCALE} -gt 5 ] || [ "$SCALE" -gt 10000 ]; then
  echo "run.sh: GPU_CHECK_BUDGET_SCALE=$SCALE is over 10000 percent (100 times the budgets):" \
    "give at most 10000" >&2
  exit 2
fi
if ! [[ ${GPU_CHECK_DEADLINE_S:-1} =~ ^0*([1-9][0-9]*)$ ]]; then
  echo "run.sh: GPU_CHECK_DEADLINE_S='$GPU_CHECK_DEADLINE_S' is no positive whole number of" \
    "seconds (leave it unset for the default)" >&2
  exit 2
fi
[ -z "${GPU_CHECK_DEADLINE_S:-}" ] || GPU_CHECK_DEADLINE_S=${BASH_REMATCH[1]}  # decimal, as SCALE
deadline_text=${GPU_CHECK_DEADLINE_S:-}
if [ ${#deadline_text} -gt 5 ] || [ "${deadline_text:-1}" -gt 86400 ]; then
  echo "run.sh: GPU_CHECK_DEADLINE_S=$GPU_CHECK_DEADLINE_S is over 86400 seconds (a day):" \
    "give at most 86400, or leave it unset for the default" >&2
  exit 2
fi
# How long the daemon has to exit after SIGTERM before it is killed (a failure).
if ! [[ ${GPU_CHECK_STOP_GRACE_S:-10} =~ ^0*([1-9][0-9]{0,2})$ ]] || [ "${BASH_REMATCH[1]}" -gt 600 ]; then
  echo "run.sh: GPU_CHECK_STOP_GRACE_S='$GPU_CHECK_STOP_GRACE_S' is no whole number of seconds" \
    "from 1 to 600 (leave it unset for the default, 10)" >&2
  exit 2
fi
STOP_GRACE_S=${BASH_REMATCH[1]}
scaled() { local s=$(( $1 * SCALE / 100 )); echo $(( s > 0 ? s : 1 )); }  # at least 1 s

# Budgets in seconds, in run order. DEADLINE_S minus the sum of the chosen steps' budgets (at
# least 40 s in a full run, RESERVE_S in a GPU_CHECK_ONLY one) is the reserve for the shell
# between steps and timeout's 2 s kill grace of a step that overran.
BUDGETS="unit_engine:10 unit_export:8 kernels:15 ipc:15 ipc_cross_uid:6 calib_measured:14 calib_model:10
python_warm:15 python_env:15 daemon_start:15 context:6 data_pair:25 rates:15 ordering:16 spin:8
free_mid:8 health1:8 killed:13 probes_off:15 torch_off:47 torch_on:16 transformers_off:38
transformers_on:20 step_timing:60 compiled:12 probes_on:10 galore:47 health2:7 stop:12"
declare -A BUDGET
steps=()  # the step names, in run order
for b in $BUDGETS; do
  BUDGET[${b%%:*}]=$(scaled "${b##*:}"); steps+=("${b%%:*}")
done
budget_s() { local s=0 n; for n in "$@"; do s=$((s + BUDGET[$n])); done; echo $s; }
RESERVE_S=$(scaled 30)  # the default deadline of a GPU_CHECK_ONLY run: budgets + this

# What a step chosen by GPU_CHECK_ONLY needs besides itself (each then runs in its place in the
# order above). kernels finds out whether the GPU is usable, ipc picks the daemon's backend (cuda,
# else shm); daemon_start and stop go together; health1 checks the daemon after free_mid.
NEEDS="ipc:kernels ipc_cross_uid:ipc calib_measured:kernels calib_model:kernels
python_env:python_warm daemon_start:ipc,stop stop:daemon_start context:daemon_start
data_pair:daemon_start rates:daemon_start ordering:daemon_start spin:daemon_start
free_mid:daemon_start health1:free_mid killed:daemon_start health2:daemon_start
probes_off:daemon_start,python_env torch_off:daemon_start,python_env
torch_on:daemon_start,python_env transformers_off:daemon_start,python_env
transformers_on:daemon_start,python_env step_timing:daemon_start,python_env
compiled:daemon_start,python_env probes_on:daemon_start,python_env galore:daemon_start,python_env"
declare -A NEED
for n in $NEEDS; do NEED[${n%%:*}]=${n#*:}; done
with_needs() {  # with_needs NAME...: those steps and everything they need, one a line, in run order
  local -A got=(); local todo=("$@") n deps
  while [ ${#todo[@]} -gt 0 ]; do
    n=${todo[0]}; todo=("${todo[@]:1}")
    [ -z "${got[$n]:-}" ] || continue
    got[$n]=1
    [ -z "${NEED[$n]:-}" ] || { IFS=, read -ra deps <<< "${NEED[$n]}"; todo+=("${deps[@]}"); }
  done
  for n in "${steps[@]}"; do [ -z "${got[$n]:-}" ] || echo "$n"; done
}

# GPU_CHECK_ONLY: the chosen steps with what they need; unset or empty: every step. Names are
# separated by commas or any whitespace (newlines and tabs too).
only_text=${GPU_CHECK_ONLY:-}
read -ra only <<< "$(printf '%s' "$only_text" | tr -s ',[:space:]' ' ')"
declare -A seen_name=(); named=()  # each name once, in the order first given
for n in "${only[@]}"; do [ -n "${seen_name[$n]:-}" ] || { seen_name[$n]=1; named+=("$n"); }; done
only=("${named[@]}")
if [ -n "$only_text" ] && [ ${#only[@]} -eq 0 ]; then
  echo "run.sh: GPU_CHECK_ONLY names no step (it holds only separators): leave it unset or empty" \
    "to run every step, or name steps among: ${steps[*]}" >&2
  exit 2
fi
unknown=()
for n in "${only[@]}"; do [ -n "${BUDGET[$n]+x}" ] || unknown+=("'$n'"); done
if [ ${#unknown[@]} -gt 0 ]; then
  if [ ${#unknown[@]} -eq 1 ]; then what="${unknown[0]}, which is no step"
  else  # 'a', 'b' and 'c'
    what="$(printf '%s, ' "${unknown[@]:0:${#unknown[@]}-1}")"
    what="${what%, } and ${unknown[-1]}, which are no steps"
  fi
  echo "run.sh: GPU_CHECK_ONLY names $what; the steps are: ${steps[*]}" \
    "(commas or whitespace between names)" >&2
  exit 2
fi
if [ ${#only[@]} -gt 0 ]; then mapfile -t chosen_steps < <(with_needs "${only[@]}")
else chosen_steps=("${steps[@]}"); fi
declare -A CHOSEN PASSED  # PASSED: the steps that ran and passed (or found IPC unsupported)
for n in "${chosen_steps[@]}"; do CHOSEN[$n]=1; done
chosen() { [ -n "${CHOSEN[$1]:-}" ]; }
CHOSEN_SUM=$(budget_s "${chosen_steps[@]}")
if [ ${#only[@]} -gt 0 ]; then
  DEADLINE_S=${GPU_CHECK_DEADLINE_S:-$((CHOSEN_SUM + RESERVE_S))}
else
  DEADLINE_S=${GPU_CHECK_DEADLINE_S:-$(scaled 546)}
  # Budgets rounded up to 1 s at a small scale can add up to more than the scaled 546 s.
  [ -n "${GPU_CHECK_DEADLINE_S:-}" ] || [ "$DEADLINE_S" -ge $((CHOSEN_SUM + RESERVE_S)) ] ||
    DEADLINE_S=$((CHOSEN_SUM + RESERVE_S))
fi
deadline_s=$((start_s + DEADLINE_S))

logs=${OUT:-$(mktemp -d /tmp/offloadd-gpu-XXXXXX)}
mkdir -p "$logs"
LIB="$here/lib"
PY=${PYTHON:-python3}
sock=/tmp/offloadd-gpu-$$.sock
figures="$logs/figures.txt"
: > "$figures"; : > "$logs/failures.txt"
fails=0 notrun=0 ipc_ok=1 gpu_listed=0 py_ok=1 daemon="" bins_ok=1
ipc_why="IPC unsupported in this sandbox"
PYPATH="$here/python"

say() { echo "== $*"; }
figure() { echo "FIGURE $*" | tee -a "$figures"; }
fail() { echo "FAIL: $*" | tee -a "$logs/failures.txt"; fails=$((fails + 1)); }
left() { echo $((deadline_s - $(date +%s))); }
rerun_line() {  # rerun_line NAME...: the command that reruns those chosen NAMEs that did not pass
  local n redo=() all scale=""
  for n in "$@"; do chosen "$n" && [ -z "${PASSED[$n]:-}" ] && redo+=("$n"); done
  [ ${#redo[@]} -gt 0 ] || return 0
  mapfile -t all < <(with_needs "${redo[@]}")
  [ "$SCALE" = 100 ] || scale="GPU_CHECK_BUDGET_SCALE=$SCALE "
  local IFS=,
  echo "RERUN the failed and not-run steps ($(( $(budget_s "${all[@]}") + RESERVE_S )) s by the" \
    "budgets): ${scale}GPU_CHECK_ONLY=${redo[*]} bash $(printf %q "$0")"
}

# run_step NAME CMD...: runs CMD (a program, not a shell function) under the step's budget,
# output to $logs/NAME.log; prints its PASS/FAIL/SKIPPED/FIGURE/NOTE lines and collects the
# figures. A status other than 0 (or $ok_rc, reset after each step) fails the run. Returns CMD's
# status, 124 on a timeout, 200 when the step did not fit before the deadline, 201 (silently)
# when GPU_CHECK_ONLY left it out.
ok_rc=0
run_step() {
  chosen "$1" || return 201
  local name=$1 b=${BUDGET[$1]} fails0=$fails; shift
  local l; l=$(left)
  if [ "$b" -gt "$l" ]; then
    echo "NOT RUN (budget): $name needs $b s, $l s left before the $DEADLINE_S s deadline"
    notrun=$((notrun + 1)); return 200
  fi
  local t0; t0=$(date +%s)
  timeout -k 2 "$b" "$@" > "$logs/$name.log" 2>&1
  local rc=$?
  grep -E "^(PASS|FAIL|SKIPPED|FIGURE|NOTE|IPC unsupported|torch |\[  PASSED|\[  FAILED)" \
    "$logs/$name.log" | sed "s/^/[$name] /"
  grep "^FIGURE" "$logs/$name.log" >> "$figures"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    fail "$name ran past its $b s budget (log: $logs/$name.log)"; tail -5 "$logs/$name.log"
  elif [ $rc -ne 0 ] && [ $rc -ne "$ok_rc" ]; then
    if ! grep -q "^FAIL" "$logs/$name.log"; then tail -8 "$logs/$name.log"; fi
    fail "$name exited $rc (log: $logs/$name.log)"
  fi
  if [ $gpu_listed -eq 1 ] && grep -q "^SKIPPED" "$logs/$name.log"; then
    fail "$name printed SKIPPED while nvidia-smi lists a GPU"
  fi
  echo "   ($name: $(( $(date +%s) - t0 )) s of $b s)"
  [ $fails -ne "$fails0" ] || PASSED[$name]=1
  ok_rc=0
  return $rc
}
BIN=(env LD_LIBRARY_PATH="$LIB")  # our binaries with the bundled libraries
not_run() {  # not_run NAME WHY: a chosen step that cannot run says so and counts (others: nothing)
  chosen "$1" || return 0
  echo "NOT RUN: $1 ($2)"; notrun=$((notrun + 1))
}
needs() {  # needs NAME WHAT...: prints NOT RUN (or FAIL) and returns 1 unless every WHAT holds
  local name=$1 w; shift  # (returns 1 silently for a step GPU_CHECK_ONLY left out)
  chosen "$name" || return 1
  for w in "$@"; do
    case $w in
      ipc) if [ $ipc_ok -ne 1 ]; then
             echo "NOT RUN: $name needs CUDA IPC ($ipc_why)"
             notrun=$((notrun + 1)); return 1
           fi ;;
      py) if [ $py_ok -ne 1 ]; then
            echo "NOT RUN: $name needs python3 with torch, grpcio and protobuf (see env)"
            notrun=$((notrun + 1)); return 1
          fi ;;
      daemon) if [ -z "$daemon" ] || ! kill -0 "$daemon" 2>/dev/null; then
                fail "$name: the daemon is not running"; return 1
              fi ;;
    esac
  done
}

stop_daemon() {  # SIGTERM, then SIGKILL after STOP_GRACE_S; returns 0 only for a clean exit 0
  [ -n "$daemon" ] || return 0
  kill -TERM "$daemon" 2>/dev/null
  local i
  for i in $(seq 1 $((STOP_GRACE_S * 10))); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$daemon" 2>/dev/null; then
    kill -KILL "$daemon" 2>/dev/null; wait "$daemon" 2>/dev/null; daemon=""
    echo "FAIL: offloadd did not exit within $STOP_GRACE_S s of SIGTERM: killed"; return 1
  fi
  wait "$daemon"; local rc=$?; daemon=""
  [ $rc -eq 0 ] || { echo "FAIL: offloadd exited $rc on SIGTERM"; return 1; }
}
warm=""
trap 'stop_daemon >/dev/null 2>&1; [ -z "$warm" ] || kill "$warm" 2>/dev/null; rm -f "$sock"' EXIT

say "bundle $(head -1 "$here/MANIFEST" 2>/dev/null)"
if [ ${#only[@]} -gt 0 ]; then
  say "GPU_CHECK_ONLY=$(IFS=,; echo "${only[*]}"): only ${chosen_steps[*]} (the steps named and" \
    "what they need)"
fi
say "deadline $DEADLINE_S s; step budgets (s), $CHOSEN_SUM in all, reserve $((DEADLINE_S - CHOSEN_SUM)):"
for n in "${chosen_steps[@]}"; do echo "$n:${BUDGET[$n]}"; done | paste -sd' ' | fold -s -w 96 |
  sed 's/^/   /'
if [ "$CHOSEN_SUM" -gt "$DEADLINE_S" ]; then
  echo "NOTE: the budgets ($CHOSEN_SUM s) exceed GPU_CHECK_DEADLINE_S=$DEADLINE_S: later steps will not run"
fi

# 0. Environment: kernel, sandbox, driver, CPU/memory limits (Python's packages: step 4b).
say "environment"
echo "kernel: $(uname -r) ($(uname -m)); $(nproc) CPUs"
if dmesg 2>/dev/null | grep -qi gvisor || grep -q "4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016" /proc/version 2>/dev/null; then
  echo "sandbox: gVisor (CUDA IPC is likely unsupported)"
fi
mem_avail_mib=$(awk '/^MemAvailable:/ { print int($2 / 1024) }' /proc/meminfo)
echo "memory: MemAvailable ${mem_avail_mib} MiB; RLIMIT_MEMLOCK $(ulimit -l) KiB; /dev/shm $(df -m /dev/shm 2>/dev/null | awk 'NR == 2 { print $4 " MiB free" }')"
if command -v nvidia-smi > /dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
  gpu_listed=1
  nvidia-smi --query-gpu=name,uuid,pci.bus_id,driver_version,memory.total,memory.used \
    --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /'
  echo "driver: $(nvidia-smi 2>/dev/null | grep -o 'Driver Version: [0-9.]*\|CUDA Version: [0-9.]*' | paste -sd' ')"
else
  echo "gpu: nvidia-smi lists none"
fi
grep -E "^(needs|cuda toolkit)" "$here/MANIFEST" 2>/dev/null | sed 's/^/bundle /'
pyver=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo none)
# The client as users install it: the bundle's wheel, installed by the machine's pip (no
# dependencies, no index) into $logs/site, ahead of python/ on the path; unpacked there if pip
# fails (a wheel is a zip of the installed files). A bundle without a wheel uses python/.
for whl in "$here"/wheel/offloadd-*.whl; do
  [ -f "$whl" ] || continue
  rm -rf "$logs/site"
  if "$PY" -m pip install -q --no-deps --no-index --disable-pip-version-check \
      --target "$logs/site" "$whl" > "$logs/wheel_install.log" 2>&1; then
    echo "python: $(basename "$whl") installed with pip --no-deps into $logs/site"
  else
    "$PY" -m zipfile -e "$whl" "$logs/site"
    echo "python: pip could not install $(basename "$whl") ($(tail -1 "$logs/wheel_install.log")):" \
      "unpacked into $logs/site"
  fi
  PYPATH="$logs/site:$here/python"
  unset OFFLOADD_CORE_LIB  # the wheel's own core, as users get it, not one the environment names
done
pydeps_probe='import grpc, google.protobuf; print("grpcio", grpc.__version__, "protobuf", google.protobuf.__version__)'
if ! PYTHONPATH="$PYPATH" "$PY" -c "$pydeps_probe" > /dev/null 2>&1; then
  tag=cp${pyver/./}
  wheels=$(ls "$here"/pydeps/*-"$tag"-*.whl "$here"/pydeps/*-abi3-*.whl "$here"/pydeps/*-py3-none-any.whl 2>/dev/null)
  if [ -n "$wheels" ] && ls "$here"/pydeps/grpcio-*-"$tag"-*.whl > /dev/null 2>&1; then
    mkdir -p "$logs/pydeps"
    for w in $wheels; do "$PY" -m zipfile -e "$w" "$logs/pydeps/" 2>/dev/null; done
    PYPATH="$PYPATH:$logs/pydeps"
    echo "python: grpcio/protobuf missing from python3 $pyver: using the bundle's wheels ($tag)"
  else
    echo "python: python3 $pyver has no grpcio/protobuf and the bundle has no grpcio wheel for $tag"
  fi
fi
# torch's first import on a fresh machine reads gigabytes of libraries: warm the page cache in
# the background while the binaries' steps run (python_env below then imports it warm).
if chosen python_warm; then
  PYTHONPATH="$PYPATH" "$PY" -c 'import torch, transformers' > /dev/null 2>&1 &
  warm=$!
fi

# 1. Fake-based unit tests of the cuda engine and client export (no GPU needed).
run_step unit_engine "${BIN[@]}" "$here/bin/cuda_engine_test" --gtest_brief=1
run_step unit_export "${BIN[@]}" "$here/bin/cuda_export_test" --gtest_brief=1

# 2. Kernels vs CPU references; without a driver nothing else can run.
run_step kernels "${BIN[@]}" "$here/bin/kernels_gpu_check"
if chosen kernels && [ ! -f "$logs/kernels.log" ]; then
  rerun_line "${steps[@]}"
  echo "RESULT: the deadline left no time to find out whether a GPU is usable"; exit 2
fi
if chosen kernels && grep -q "^SKIPPED" "$logs/kernels.log"; then
  if [ $gpu_listed -eq 0 ]; then
    if [ ${#only[@]} -eq 0 ]; then
      echo "SKIPPED: no usable CUDA driver/GPU here; nothing else to run (unit tests above ran)"
      rerun_line unit_engine unit_export
      if [ $fails -gt 0 ]; then
        echo "RESULT: $fails failure(s) in the unit tests; no usable CUDA driver/GPU for the rest"
        exit 1
      fi
      echo "RESULT: the unit tests passed; no usable CUDA driver/GPU for the rest"; exit 0
    fi
    # GPU_CHECK_ONLY: the chosen steps from the kernels check on did not run: exit 2.
    gpu_steps=() units_ran=""
    for n in "${chosen_steps[@]}"; do
      case $n in
        unit_*) units_ran=" (the chosen unit tests above ran)" ;;
        *) gpu_steps+=("$n") ;;
      esac
    done
    echo "SKIPPED: no usable CUDA driver/GPU here, so these chosen steps did not run:" \
      "${gpu_steps[*]}$units_ran"
    unset 'PASSED[kernels]'  # it found no GPU: a step that did not run, as the line says
    rerun_line "${steps[@]}"
    echo "RESULT: $fails failure(s), $((notrun + ${#gpu_steps[@]})) step(s) not run (no usable" \
      "CUDA driver/GPU)"
    exit $(( fails > 0 ? 1 : 2 ))
  fi
  grep -q "error 35" "$logs/kernels.log" &&
    fail "the driver is older than the bundle's CUDA runtime (see 'driver:' and 'bundle needs:'" \
      "above): rebuild the bundle with a matching toolkit"
  echo "NOTE: the bundle's CUDA binaries cannot use the listed GPU: only the Python checks run," \
    "against an shm daemon"
  bins_ok=0 ipc_ok=0 ipc_why="the bundle's CUDA binaries cannot use this GPU"
fi

# 3. Cross-process CUDA IPC, before anything relies on it.
ipc_rc=0
if chosen ipc; then
  say "CUDA IPC between two processes"
  if [ $bins_ok -eq 1 ]; then
    ok_rc=3 run_step ipc "${BIN[@]}" "$here/bin/gpu_probes" --mode=ipc
    ipc_rc=$?
  else
    not_run ipc "$ipc_why"
  fi
fi
if [ $ipc_rc -eq 3 ]; then
  ipc_ok=0
  echo "IPC unsupported in this sandbox: steps that need it are NOT RUN; torch checks use an shm daemon"
elif [ $ipc_rc -ne 0 ]; then
  ipc_ok=0 ipc_why="the IPC probe failed"; fail "the IPC probe exited $ipc_rc: treating IPC as unusable"
fi
# Whether IPC handles cross users (docs/failure-modes.md): observed, never a failure by itself.
if needs ipc_cross_uid ipc; then
  say "CUDA IPC across users (figures only)"
  run_step ipc_cross_uid "${BIN[@]}" "$here/bin/gpu_probes" --mode=ipc_cross_uid
fi

# 4. Calibration of the copy timing model: copy_sim_bench's workload through the real cuda
# engine (--backend=cuda), then the model with the same configuration, on idle GPUs.
if chosen calib_measured || chosen calib_model; then
  say "calibration: real cuda engine vs the timing model, same workload"
  ngpu=$(nvidia-smi --list-gpus 2>/dev/null | wc -l); [ "$ngpu" -ge 1 ] || ngpu=1
  [ "$ngpu" -le 8 ] || ngpu=8
  calib="--gpus=$ngpu --gpus_per_switch=$ngpu --numa_nodes=1 --placement=local --engine=sync,async \
    --chunk_mib=1,8,32 --repeats=2 --seconds=0.4 --rate_gbps=${CALIB_RATE_GBPS:-55} --figures=1"
  if [ $bins_ok -eq 1 ]; then
    # shellcheck disable=SC2086
    run_step calib_measured "${BIN[@]}" "$here/bin/copy_sim_bench" --backend=cuda $calib
    # shellcheck disable=SC2086
    run_step calib_model "${BIN[@]}" "$here/bin/copy_sim_bench" --backend=sim $calib
  else
    not_run calib_measured "$ipc_why"; not_run calib_model "$ipc_why"
  fi
  for e in sync async; do for c in 1 8 32; do
    m=$(grep "^FIGURE copy_measured_${e}_local_${c}MiB " "$logs/calib_measured.log" 2>/dev/null)
    s=$(grep "^FIGURE copy_model_${e}_local_${c}MiB " "$logs/calib_model.log" 2>/dev/null)
    [ -n "$m" ] && [ -n "$s" ] || continue
    # FIGURE <name> d2h <GB/s> GB/s h2d <GB/s> GB/s urgent_reload_median <chunk-times> ...
    read -r md mh mu <<< "$(echo "$m" | awk '{ print $4, $7, $10 }')"
    read -r sd sh su <<< "$(echo "$s" | awk '{ print $4, $7, $10 }')"
    figure "calib_${e}_${c}MiB d2h measured $md model $sd GB/s; h2d measured $mh model $sh GB/s;" \
      "urgent reload median measured $mu model $su chunk-times"
  done; done
fi

# 4b. Python and its packages (torch imported warm by now).
if chosen python_warm; then
  say "python"
  for _ in $(seq 1 $((BUDGET[python_warm] * 10))); do kill -0 "$warm" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$warm" 2>/dev/null; then
    echo "NOTE: importing torch and transformers took over ${BUDGET[python_warm]} s (cold disk?)"
    kill "$warm" 2>/dev/null
  fi
  wait "$warm" 2>/dev/null; warm=""; PASSED[python_warm]=1
fi
run_step python_env env PYTHONPATH="$PYPATH" "$PY" -c '
import sys
print("NOTE python", sys.version.split()[0], sys.executable)
try:
    import grpc, google.protobuf
    print("NOTE grpcio", grpc.__version__, "protobuf", google.protobuf.__version__)
except ImportError as e:
    print("FAIL: python3 cannot import grpcio/protobuf: %s" % e); sys.exit(1)
try:
    import torch
except ImportError as e:
    print("FAIL: python3 has no torch: %s" % e); sys.exit(1)
print("NOTE torch", torch.__version__, "built for CUDA", torch.version.cuda,
      "cuda available", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
try:
    from importlib.metadata import version
    print("NOTE transformers", version("transformers"))
except Exception:
    print("NOTE transformers not installed (transformers_check will fail)")
sys.path.insert(0, sys.argv[1])
try:
    import offloadd.torch as ot
    print("NOTE offloadd.torch supports torch %s" % (ot.SUPPORTED_TORCH,))
except ImportError as e:
    print("FAIL: %s" % e); sys.exit(1)
import os, offloadd
print("NOTE offloadd from", os.path.dirname(offloadd.__file__))
if os.path.exists(os.path.join(os.path.dirname(offloadd.__file__), "liboffloadd_core.so")):
    from offloadd import _native
    try:
        print("NOTE offloadd native core", _native.load()._name)
    except OSError as e:
        print("FAIL: the wheel'"'"'s native core does not load: %s" % e); sys.exit(1)
 ' "$here/python"
# Only a missing package disables the Python steps; a slow import (a timeout) does not.
grep -q "^FAIL" "$logs/python_env.log" 2>/dev/null && py_ok=0


# 5. The daemon: cuda backend (shm without IPC), pool sized from MemAvailable.
pool_mib=$(( mem_avail_mib * 40 / 100 ))
[ $pool_mib -le 8192 ] || pool_mib=8192
[ $pool_mib -ge 512 ] || pool_mib=512
backend=cuda; [ $ipc_ok -eq 1 ] || backend=shm
mlock_flag=""
if [ "${POOL_MLOCK:-0}" = 1 ]; then
  lim=$(ulimit -l)
  if [ "$lim" = unlimited ] || [ "$lim" -ge $((pool_mib * 1024)) ]; then mlock_flag=--pool_mlock=true
  else echo "NOTE: POOL_MLOCK=1 but RLIMIT_MEMLOCK is $lim KiB < the ${pool_mib} MiB pool: pool_mlock left off"
  fi
fi
n_pair=$(( pool_mib / 64 / 3 )); [ $n_pair -le 16 ] || n_pair=16; [ $n_pair -ge 2 ] || n_pair=2
n_rates=$(( (pool_mib - 64) * 2 / 64 / 5 )); [ $n_rates -le 16 ] || n_rates=16; [ $n_rates -ge 2 ] || n_rates=2
n_seg=$(( pool_mib / 512 / 2 )); [ $n_seg -le 8 ] || n_seg=8; [ $n_seg -ge 1 ] || n_seg=1
n_kill=$(( pool_mib / 64 / 2 )); [ $n_kill -le 48 ] || n_kill=48; [ $n_kill -ge 4 ] || n_kill=4
# The daemon's metrics port: one the kernel finds free now (a fixed one may be taken, and a
# daemon that cannot bind its metrics port does not start); none (metrics off) without Python.
metrics_port=$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])' 2>/dev/null)
scrape_sum() {  # scrape_sum FAMILY: "<series> <sum>" of the family on the daemon's /metrics
  [ -n "$metrics_port" ] || return 1
  "$PY" - "$metrics_port" "$1" <<'EOF'
import sys, urllib.request
text = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=5).read()
vals = [float(l.split()[-1]) for l in text.decode().splitlines()
        if l.startswith(sys.argv[2] + "{") or l.startswith(sys.argv[2] + " ")]
print("%d %d" % (len(vals), sum(vals)))
EOF
}
start_daemon() {
  LD_LIBRARY_PATH="$LIB" "$here/bin/offloadd" --backend=$backend --pool_bytes=${pool_mib}MiB \
    $mlock_flag --socket_path="$sock" --chunk_bytes=8MiB \
    --metrics_address=${metrics_port:+127.0.0.1:$metrics_port} > "$logs/daemon.log" 2>&1 &
  daemon=$!
  local t_end=$(( $(date +%s) + ${BUDGET[daemon_start]} ))
  while [ "$(date +%s)" -lt $t_end ]; do
    grep -q "ready on" "$logs/daemon.log" && break
    kill -0 $daemon 2>/dev/null || break
    sleep 0.1
  done
  if ! grep -q "ready on" "$logs/daemon.log"; then
    if [ -n "$metrics_port" ] && grep -q "cannot serve metrics" "$logs/daemon.log"; then
      # Taken since it was found free: the checks need the daemon more than its metrics.
      echo "NOTE: metrics port $metrics_port taken: the daemon runs without metrics"
      stop_daemon > /dev/null; metrics_port=""; start_daemon; return
    fi
    fail "offloadd did not start:"; tail -20 "$logs/daemon.log"; stop_daemon; daemon=""; return 1
  fi
  # The pool is pinned from the first GPU a session uses (no context on a GPU nobody uses): its
  # "host pool pinned" line comes after the first client and is printed at the stop.
  grep -o "calibrat.*" "$logs/daemon.log" | head -4 | sed 's/^/daemon: /'
}
if chosen daemon_start; then
  figure "pool_bytes $((pool_mib << 20)) bytes (40% of MemAvailable ${mem_avail_mib} MiB, within 512 MiB-8 GiB)"
  say "starting offloadd (backend $backend, pool ${pool_mib} MiB${mlock_flag:+, mlock})"
  start_daemon && PASSED[daemon_start]=1
fi
E2E="$here/bin/gpu_e2e"
PROBES="$here/bin/gpu_probes"

# 6. Daemon probes that need CUDA IPC.
if needs context ipc daemon; then
  run_step context "${BIN[@]}" "$E2E" --mode=context --socket="$sock"
fi
if needs data_pair ipc daemon; then
  say "two clients at once, $n_pair x 64 MiB each, checksums on the device"
  run_step data_pair bash -c '
    for c in 1 2; do
      LD_LIBRARY_PATH="$1" "$2" --mode=data --socket="$3" --seed=$c --tensors="$4" > "$5/pair$c.log" 2>&1 &
    done
    wait
    for c in 1 2; do sed "s/^FIGURE daemon_/FIGURE pair_client${c}_daemon_/" "$5/pair$c.log"; done
    grep -q "^PASS data" "$5/pair1.log" && grep -q "^PASS data" "$5/pair2.log"' \
    _ "$LIB" "$E2E" "$sock" "$n_pair" "$logs"
fi
if needs rates ipc daemon; then
  say "rates: daemon vs cudaMemcpyAsync on the same device buffers; urgent reloads under saturation"
  run_step rates "${BIN[@]}" "$PROBES" --mode=rates --socket="$sock" --tensors=$n_rates --chunk_mib=8
fi
if needs ordering ipc daemon; then
  run_step ordering "${BIN[@]}" "$E2E" --mode=ordering --socket="$sock" --iterations=100 --tensor_mib=64
fi
if needs spin ipc daemon; then
  say "offload A, then B behind a 200 ms spin kernel"
  run_step spin "${BIN[@]}" "$PROBES" --mode=spin --socket="$sock" --spin_ms=200
fi
health() {  # health NAME: a short data run on the same daemon must pass
  needs "$1" ipc daemon || return
  run_step "$1" "${BIN[@]}" "$E2E" --mode=data --socket="$sock" --seed=9 --tensors=4 --small_requests=20
}
if needs free_mid ipc daemon; then
  say "a client frees its memory with offloads in flight and exits"
  run_step free_mid "${BIN[@]}" "$PROBES" --mode=free_mid --socket="$sock" --tensors=8
  sleep 1
fi
health health1  # (after free_mid; NOT RUN for the same reasons)
if needs killed ipc daemon; then
  say "a client killed with copies in flight"
  run_step killed bash -c '
    LD_LIBRARY_PATH="$1" "$2" --mode=data --socket="$3" --seed=4 --tensors="$4" > "$5/victim.log" 2>&1 &
    v=$!
    for _ in $(seq 1 3000); do grep -q "^OFFLOADING" "$5/victim.log" && break; kill -0 $v 2>/dev/null || break; sleep 0.01; done
    sleep 0.02; kill -9 $v 2>/dev/null; wait $v 2>/dev/null
    grep -q "^OFFLOADING" "$5/victim.log" || { echo "FAIL: the victim never started"; exit 1; }
    sleep 2
    PYTHONPATH="$6" "$7" - "$3" <<EOF
import sys
from offloadd.client import Client
c = Client(socket_path=sys.argv[1], client_name="gpu-check stats", device_id="stats")
s = c.get_stats()
print("FIGURE after_kill_pool_used_bytes %d bytes" % s.pool_used_bytes)
print("FIGURE after_kill_blocks %d blocks" % s.blocks)
print("FIGURE after_kill_sessions_open %d sessions (this one included)" % s.sessions_open)
c.close()
ok = s.pool_used_bytes == 0 and s.blocks == 0
print("PASS killed: the blocks of the killed client were released" if ok else
      "FAIL: the blocks of the killed client were not released")
sys.exit(0 if ok else 1)
EOF' _ "$LIB" "$E2E" "$sock" "$n_kill" "$logs" "$PYPATH" "$PY"
fi

# 7. Python probes and the torch checks, expandable segments off then on. Without IPC the
# daemon is an shm one: the checks then measure the staging path (figures say so in the log).
torch_step() {  # torch_step NAME off|on SCRIPT ARGS...
  local name=$1 mode=$2; shift 2
  needs "$name" py daemon || return
  local conf=expandable_segments:False; [ "$mode" = on ] && conf=expandable_segments:True
  run_step "$name" env PYTORCH_CUDA_ALLOC_CONF=$conf PYTHONPATH="$PYPATH" "$PY" "$@"
}
if needs probes_off ipc; then
  torch_step probes_off off "$here/cuda_probes.py" --socket="$sock" --python-root="$here/python" \
    --probes=sticky,empty_cache,runtime_expandable --segments=$n_seg
fi
torch_step torch_off off "$here/torch_check.py" --socket="$sock" --python-root="$here/python" \
  --seqs=2048,4096
torch_step torch_on on "$here/torch_check.py" --socket="$sock" --python-root="$here/python" \
  --seqs=2048 --steps=2
torch_step transformers_off off "$here/transformers_check.py" --socket="$sock" --fixture-dir="$here"
torch_step transformers_on on "$here/transformers_check.py" --socket="$sock" --fixture-dir="$here" \
  --seqs=2048 --trainer-steps=2 --timed-steps=1
# Step time per mode; the script stops starting rounds 15 s before its budget ends (imports and the
# models' set-up fit in those), so it always prints what it measured.
torch_step step_timing off "$here/step_timing.py" --socket="$sock" --python-root="$here/python" \
  --fixture-dir="$here" --seqs=2048,4096 --steps=20 --time-limit-s=$((BUDGET[step_timing] - 15))
torch_step compiled off "$here/compiled_check.py" --socket="$sock" --python-root="$here/python"
if needs probes_on ipc; then
  torch_step probes_on on "$here/cuda_probes.py" --socket="$sock" --python-root="$here/python" \
    --probes=sticky
fi

# 7b. GaLore through the Trainer on CUDA: offloadd.galore with projector backend lapack (the
# daemon above) and cusolver (a second daemon), against stock galore-torch (SKIPPED without it).
galore_step() {
  needs galore py daemon || return
  echo 'projector { backend: "cusolver" }' > "$logs/cusolver.conf"
  LD_LIBRARY_PATH="$LIB" "$here/bin/offloadd" --backend=$backend --pool_bytes=1GiB \
    --config="$logs/cusolver.conf" --socket_path="$sock.cusolver" --metrics_address= \
    > "$logs/daemon-cusolver.log" 2>&1 &
  local d2=$!
  for _ in $(seq 1 100); do  # up to 10 s; a daemon that exited (no cusolver here) is not waited for
    grep -q "ready on" "$logs/daemon-cusolver.log" && break; kill -0 $d2 2>/dev/null || break; sleep 0.1
  done
  local gpath=$PYPATH
  # (torch's import makes that of galore_torch seconds long: tried only when the bundle has one)
  if [ -d "$here/pydeps/galore" ] && ! "$PY" -c 'import galore_torch' > /dev/null 2>&1; then
    gpath="$PYPATH:$here/pydeps/galore"
    echo "NOTE: galore-torch/bitsandbytes from the bundle (pydeps/galore: pinned versions)"
  fi
  run_step galore env PYTHONPATH="$gpath" "$PY" "$here/galore_check.py" --socket="$sock" \
    --cusolver-socket="$sock.cusolver" --fixture-dir="$here"
  kill -TERM $d2 2>/dev/null  # then SIGKILL after STOP_GRACE_S, as stop_daemon does
  for _ in $(seq 1 $((STOP_GRACE_S * 10))); do kill -0 $d2 2>/dev/null || break; sleep 0.1; done
  kill -KILL $d2 2>/dev/null; wait $d2 2>/dev/null
}
galore_step

# 8. The same daemon still serves after everything above; handle opens and closes; clean stop.
health health2
if [ -n "$daemon" ]; then
  fails0=$fails
  # Every session is closed: no client mapping may be left open (a freed segment still mapped).
  read -r n_open open_now <<< "$(scrape_sum offloadd_ipc_handles_open 2>/dev/null || echo "x x")"
  read -r n_opens opens <<< "$(scrape_sum offloadd_ipc_handle_opens_total 2>/dev/null || echo "x x")"
  if [ "$n_open" = x ]; then
    echo "NOTE: could not scrape the daemon's metrics (${metrics_port:+127.0.0.1:$metrics_port}${metrics_port:-metrics off})"
  else
    figure "ipc_handles_open_after_all_sessions $open_now handles ($n_open series);" \
      "ipc_handle_opens_total $opens ($n_opens series; a device's series go with its last session)"
    [ "$open_now" -eq 0 ] || fail "$open_now client memory handles still open after every session closed"
  fi
  say "stopping offloadd (SIGTERM; killed after $STOP_GRACE_S s)"
  l=$(left)
  if [ "${BUDGET[stop]}" -gt "$l" ]; then echo "NOTE: past the deadline budget; stopping anyway"; fi
  stop_daemon || fails=$((fails + 1))
  [ $fails -ne $fails0 ] || PASSED[stop]=1
  grep -E "context on|host pool pinned" "$logs/daemon.log" | sed 's/^.*cuda: /daemon: /' | head -4
else
  not_run stop "the daemon is not running"
fi


say "figures ($(( $(date +%s) - start_s )) s of $DEADLINE_S; logs in $logs)"
cat "$figures"
rerun_line "${steps[@]}"
if [ $fails -gt 0 ]; then
  echo "failures:"; sed 's/^/   /' "$logs/failures.txt"
  echo "RESULT: $fails failure(s), $notrun step(s) not run"; exit 1
fi
if [ $notrun -gt 0 ]; then
  [ $ipc_ok -eq 1 ] || echo "RESULT: IPC unsupported in this sandbox"
  echo "RESULT: no failure, $notrun step(s) not run"; exit 2
fi
if [ ${#only[@]} -gt 0 ]; then echo "RESULT: the chosen GPU checks passed (${chosen_steps[*]})"
else echo "RESULT: all GPU checks passed"; fi
