#!/usr/bin/env bash
# `make bench`: trident's training step against PyTorch and against OpenBLAS SGEMM, all three
# measured in this one run on the same threads (bench/bench.py does the measuring and prints
# the table; results.json goes to $OUT if set, else to BUILD/bench-work/), then checkpoint
# I/O at 8 ranks against dd (bench/checkpoint_bench.py; checkpoint.json beside it), and long-
# sequence attention (bench/attention_bench.py; attention.json), and GPT-2 tokenizer throughput
# against js-tiktoken (bench/gpt2_bench.py; gpt2.json), and context parallelism's memory per rank
# and hidden ring communication (bench/cp_bench.py; cp.json).
# usage: bench/run.sh BUILD_DIR
# Knobs (environment): BENCH_THREADS (2), BENCH_TRIDENT_STEPS (30), BENCH_TORCH_STEPS (20),
#   OPENBLAS_CORETYPE (left alone if set; see bench.py), PYTHON (/usr/bin/python3).
set -euo pipefail

build=${1:?usage: bench/run.sh BUILD_DIR}
src=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-/usr/bin/python3}

[ -f "$build/CMakeCache.txt" ] || { echo "bench: $build is not a configured build directory" >&2; exit 2; }
skip=()
if ! cmake --build "$build" --target trident -j "$(nproc)"; then
  echo "bench: building trident failed; measuring PyTorch and SGEMM only" >&2
  skip=(--skip-trident)
fi
# The SGEMM microbenchmark: the CMake target when bench/ is part of the build, else compiled
# here against the OpenBLAS the build found.
sgemm="$build/bench/trident_bench_sgemm"
if ! cmake --build "$build" --target trident_bench_sgemm -j "$(nproc)" >/dev/null 2>&1; then
  echo "bench: no trident_bench_sgemm target in $build (is add_subdirectory(bench) in CMakeLists.txt?);" \
       "compiling bench/sgemm_bench.cpp directly" >&2
  inc=$(sed -n 's/^OPENBLAS_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
  lib=$(sed -n 's/^OPENBLAS_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")
  mkdir -p "$build/bench"
  "${CXX:-c++}" -O2 -std=c++17 -I"$inc" "$src/bench/sgemm_bench.cpp" "$lib" -o "$sgemm"
fi

"$python" "$src/bench/bench.py" --build "$build" --sgemm "$sgemm" "${skip[@]}"
# Long sequences (issue 18): flash attention against the T x T path and PyTorch's SDPA, and the
# whole step at T = 2048 (BENCH_BEFORE_TRIDENT: a trident binary from before, to compare, e.g.
# `git archive 5455ae0` built with `make build`: the last commit with the T x T path in the step;
# BENCH_STEP_ROUNDS: how many times before and after alternate, default 3).
if (( ${#skip[@]} == 0 )) && cmake --build "$build" --target trident_bench_attention -j "$(nproc)" >/dev/null; then
  results=${OUT:-$build/bench-work}
  mkdir -p "$results"
  "$python" "$src/bench/attention_bench.py" --build "$build" --json "$results/attention.json"
fi
# Checkpoint write/read bandwidth at 8 ranks against dd on the same disk (issue 6).
if (( ${#skip[@]} == 0 )); then
  results=${OUT:-$build/bench-work}
  mkdir -p "$results"
  "$python" "$src/bench/checkpoint_bench.py" --build "$build" --json "$results/checkpoint.json"
fi
# Token data (issue 17): reads, start-up and RSS at 10 M / 100 M / 1 G tokens, data share of
# a step, prepare-data against spm_encode (bench/data_bench.py; data.json beside the rest).
if (( ${#skip[@]} == 0 )); then
  cmake --build "$build" --target trident_bench_data_read -j "$(nproc)" >/dev/null
  "$python" "$src/bench/data_bench.py" --build "$build" --json "$results/data.json"
fi
# 2D tensor parallelism (issue 20): 1D against SUMMA on one MLP at tp = 4, d_model 512 and 1024
# (bytes per rank measured from Comm's counters beside the closed forms; the wall time of 4
# ranks on this machine's cores; the stash per rank), then whole GPT-2 steps (2 layers, 4 x 128
# tokens: GptChunk at tp = 4 against model::Gpt2d on 2 x 2; bytes per step, step time, one
# layer's activation floats per rank beside serial's). tp2d.json: two lines per d_model.
if (( ${#skip[@]} == 0 )) && cmake --build "$build" --target trident_bench_tp2d -j "$(nproc)" >/dev/null; then
  results=${OUT:-$build/bench-work}
  mkdir -p "$results"
  mpirun -np 4 --oversubscribe --bind-to none "$build/bench/trident_bench_tp2d" --reps 5 \
    --layers 2 --seq 128 --batch 4 --vocab 1024 \
    | tee "$results/tp2d.json"
fi
# The same comparison from `trident train`'s own steps (tp = 4, 1D against 2D, d_model 512 and
# 1024): median step time and comm/tp/bytes (bench/tp2d_train_bench.py; tp2d_train.json).
if (( ${#skip[@]} == 0 )); then
  "$python" "$src/bench/tp2d_train_bench.py" --build "$build" --json "$results/tp2d_train.json"
fi
# Context parallelism (issue 30): peak activation memory per rank at T = 4096 against cp = 1, 2,
# 4 (ranks = cp; cp 4 oversubscribes a 2-core machine) and the share of the ring's messages hidden
# behind the attention tiles (bench/cp_bench.py with trident_bench_ring; cp.json).
if (( ${#skip[@]} == 0 )) && cmake --build "$build" --target trident_bench_ring -j "$(nproc)" >/dev/null; then
  results=${OUT:-$build/bench-work}
  mkdir -p "$results"
  "$python" "$src/bench/cp_bench.py" --build "$build" --json "$results/cp.json" ||
    echo "bench: cp_bench.py failed" >&2
fi
# GPT-2's BPE (issue 31): prepare-data --tokenizer gpt2 on 1 and 2 ranks against npm's
# js-tiktoken on the same KJV text (bench/gpt2_bench.py; gpt2.json). Says so and goes on
# without npm/node.
if (( ${#skip[@]} == 0 )); then
  results=${OUT:-$build/bench-work}
  mkdir -p "$results"
  "$python" "$src/bench/gpt2_bench.py" --build "$build" --json "$results/gpt2.json" ||
    echo "bench: gpt2_bench.py failed" >&2
fi
