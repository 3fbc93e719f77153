#!/usr/bin/env bash
# bench/gpu_check.sh — everything trident's CUDA backend needs checked on a real GPU, in one
# run sized for one H200 (a few minutes; well under 8):
#   1. configure and build for sm_90 into build-gpu/ (only the targets below);
#   2. the CUDA op tests (test/unit/ops/cuda: every op against the CPU backend, fp32/tf32/bf16);
#   3. cuBLAS GEMM rates on GPT-2 small/medium shapes (bench/cublas_gemm_bench.cpp);
#   4. an op-level step estimate through the CUDA backend (bench/cuda_step_bench.cpp);
#   5. compute-sanitizer memcheck and racecheck over trident's own kernels (time-bounded).
# Writes summary.txt and summary.json (and each step's log and output) to $OUT when set, else
# to build-gpu/gpu-check/. Each step runs even if an earlier one failed (where it can); the
# script ends with a table of the steps and exits 1 if any failed.
# Where trident's host dependencies (MPI, HDF5, OpenBLAS, GoogleTest...) are missing, the
# configure step fails and only the GEMM benchmark runs, built with a bare nvcc; to run
# everything there, build a bundle where the dependencies are (bench/gpu_bundle.sh), carry
# build-gpu/bundle, and set PREBUILT=build-gpu/bundle (no build step then).
# usage: bench/gpu_check.sh   knobs: PREBUILT, JOBS (nproc), BUILD (build-gpu), GEMM_REPS (20),
#        STEP_REPS (5), SANITIZE (1), MEMCHECK_TIMEOUT (150 s), RACECHECK_TIMEOUT (60 s)
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$src/build-gpu}
jobs=${JOBS:-$(nproc)}
out=${OUT:-$build/gpu-check}
mkdir -p "$out"
# nvcc: on PATH, else CUDA's usual place (CMake needs it on PATH or in CUDACXX too)
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

declare -A status=()
order=()
failed=0

# step NAME COMMAND...: runs COMMAND with its output in $out/NAME.log (and on the terminal's
# tail on failure); records ok / TIMED OUT (exit 124, from timeout) / FAILED (rc).
step() {
  local name=$1
  shift
  order+=("$name")
  echo "== $name: $*"
  local rc=0
  "$@" >"$out/$name.log" 2>&1 || rc=$?
  if [ "$rc" -eq 0 ]; then
    status[$name]=ok
  elif [ "$rc" -eq 124 ]; then
    status[$name]="TIMED OUT (its limit; log: $out/$name.log)"
    failed=1
    echo "!! $name TIMED OUT; log: $out/$name.log" >&2
  else
    status[$name]="FAILED (exit $rc; log: $out/$name.log)"
    failed=1
    echo "!! $name FAILED (exit $rc); last lines of $out/$name.log:" >&2
    tail -n 25 "$out/$name.log" >&2 || true
  fi
}

# to_file FILE COMMAND...: COMMAND's standard output into FILE (its errors go to the log).
to_file() {
  local file=$1
  shift
  "$@" >"$file"
}

skip() {
  order+=("$1")
  status[$1]="skipped: $2"
  echo "== $1: skipped: $2"
}

# ---- the machine ---------------------------------------------------------------------------
step gpu_info nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv

# ---- build (or a bundle built elsewhere: bench/gpu_bundle.sh) ---------------------------------
configure() {
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DTRIDENT_CUDA=ON
}
build_targets() {
  cmake --build "$build" -j "$jobs" --target trident_unit_ops_cuda trident_bench_cublas \
        trident_bench_cuda_step
}
# Only the cuBLAS benchmark, without trident's CMake (its dependencies are absent).
build_gemm_bench_bare() {
  mkdir -p "$build/bench"
  nvcc -O2 -std=c++17 -arch=sm_90 "$src/bench/cublas_gemm_bench.cpp" -lcublas \
       -o "$build/bench/trident_bench_cublas"
}

if [ -n "${PREBUILT:-}" ]; then
  prebuilt=$(cd "$PREBUILT" && pwd)
  skip configure "PREBUILT=$prebuilt (commit $(cat "$prebuilt/COMMIT" 2>/dev/null || echo unknown))"
  skip build "PREBUILT"
  export LD_LIBRARY_PATH="$prebuilt/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  tests=$prebuilt/trident_unit_ops_cuda
  gemm=$prebuilt/trident_bench_cublas
  step_bench=$prebuilt/trident_bench_cuda_step
  built=yes
else
  tests=$build/test/trident_unit_ops_cuda
  gemm=$build/bench/trident_bench_cublas
  step_bench=$build/bench/trident_bench_cuda_step
  built=no
  step configure configure
  if [ "${status[configure]}" = ok ]; then
    step build build_targets
    [ "${status[build]}" = ok ] && built=yes
  else
    skip build "configure failed"
    step build_gemm_bench_bare build_gemm_bench_bare
  fi
fi

# ---- run -----------------------------------------------------------------------------------
if [ "$built" = yes ] && [ -x "$tests" ]; then
  # exit 77 = no GPU visible: a failure here (the point of this script is the GPU)
  step op_tests "$tests" --gtest_output="json:$out/op_tests.json"
else
  skip op_tests "not built"
fi

if [ -x "$gemm" ]; then
  step gemm_bench to_file "$out/gemm.jsonl" "$gemm" "${GEMM_REPS:-20}"
else
  skip gemm_bench "not built"
fi

if [ "$built" = yes ] && [ -x "$step_bench" ]; then
  step step_estimate to_file "$out/step_estimate.jsonl" "$step_bench" "${STEP_REPS:-5}"
else
  skip step_estimate "not built"
fi

# Out-of-bounds accesses and shared-memory races in trident's own kernels (the fp32 cases of
# everything but the pure cuBLAS products), each bounded in time. SANITIZE=0 leaves them out.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "${SANITIZE:-1}" = 0 ]; then
  skip memcheck "SANITIZE=0"
  skip racecheck "SANITIZE=0"
elif [ "$built" != yes ] || [ ! -x "$tests" ]; then
  skip memcheck "not built"
  skip racecheck "not built"
elif [ ! -x "$sanitizer" ]; then
  skip memcheck "no compute-sanitizer"
  skip racecheck "no compute-sanitizer"
else
  step memcheck timeout "${MEMCHECK_TIMEOUT:-150}" "$sanitizer" --tool memcheck --error-exitcode 99 \
       "$tests" --gtest_filter='Fp32/*-*gemm_*:*linear_*'
  step racecheck timeout "${RACECHECK_TIMEOUT:-60}" "$sanitizer" --tool racecheck --error-exitcode 99 \
       "$tests" --gtest_filter='Fp32/*layernorm*:Fp32/*xent*:Fp32/*sum_squares*'
fi

# ---- summary -------------------------------------------------------------------------------
# GoogleTest's closing lines: "[  PASSED  ] N tests." and "[  FAILED  ] N tests, listed below:"
passed=$(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests*\..*/\1/p' "$out/op_tests.log" 2>/dev/null || true)
failed_tests=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests*, listed below.*/\1/p' "$out/op_tests.log" \
               2>/dev/null || true)
# a jsonl file as a JSON array (empty when absent)
json_lines() {
  if [ -s "$1" ]; then
    printf '[\n'
    sed -e 's/^/    /' -e '$!s/$/,/' "$1"
    printf '  ]'
  else
    printf '[]'
  fi
}
json_escape() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/"/\\"/g'; }

{
  echo "trident GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  head -n 2 "$out/gpu_info.log" 2>/dev/null | tail -n 1 || true
  echo
  for name in "${order[@]}"; do printf '  %-22s %s\n' "$name" "${status[$name]}"; done
  echo
  echo "op tests: ${passed:-0} passed, ${failed_tests:-0} failed (details: op_tests.log, op_tests.json)"
  if [ -s "$out/gemm.jsonl" ]; then
    echo
    echo "GEMM (cuBLAS, median of ${GEMM_REPS:-20}):"
    sed -n 's/.*"gemm": "\([^"]*\)", "mode": "\([^"]*\)".*"median_ms": \([0-9.]*\), "tflops": \([0-9.]*\).*/  \1 \2 \3 ms \4 TFLOP\/s/p' \
        "$out/gemm.jsonl" | awk '{printf "  %-20s %-16s %10s ms %8s TFLOP/s\n", $1, $2, $3, $5}'
  fi
  if [ -s "$out/step_estimate.jsonl" ]; then
    echo
    echo "Step estimate (B=8, T=1024, one GPU, ops only):"
    sed -n 's/.*"model": "\([^"]*\)", "precision": "\([^"]*\)".*"step_ms_est": \([0-9.]*\), "tokens_per_s_est": \([0-9.]*\), "model_tflops_est": \([0-9.]*\).*/  \1 \2 \3 ms\/step \4 tok\/s \5 TFLOP\/s/p' \
        "$out/step_estimate.jsonl" |
        awk '{printf "  %-12s %-5s %9s ms/step %9s tok/s %7s TFLOP/s\n", $1, $2, $3, $5, $7}'
  fi
} >"$out/summary.txt"

{
  printf '{\n  "result": "%s",\n  "steps": {\n' "$([ "$failed" -eq 0 ] && echo pass || echo fail)"
  n=${#order[@]}
  i=0
  for name in "${order[@]}"; do
    i=$((i + 1))
    sep=,
    [ "$i" -eq "$n" ] && sep=
    printf '    "%s": "%s"%s\n' "$name" "$(json_escape "${status[$name]}")" "$sep"
  done
  printf '  },\n  "op_tests": {"passed": %d, "failed": %d},\n' "${passed:-0}" "${failed_tests:-0}"
  printf '  "gemm": '
  json_lines "$out/gemm.jsonl"
  printf ',\n  "step_estimate": '
  json_lines "$out/step_estimate.jsonl"
  printf '\n}\n'
} >"$out/summary.json"

echo
cat "$out/summary.txt"
echo
echo "written: $out/summary.txt, $out/summary.json"
if [ "$failed" -ne 0 ]; then
  echo "GPU CHECK FAILED: see the FAILED steps above" >&2
  exit 1
fi
echo "GPU CHECK PASSED"
