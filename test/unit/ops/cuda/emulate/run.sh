#!/usr/bin/env bash
# test/unit/ops/cuda/emulate/run.sh — runs trident's CUDA kernels (src/ops/cuda/*.cu) on the
# CPU (shim/emu.hpp: the threads of a block as fibers on one OS thread), against the CPU
# backend: a check of the kernels' logic on a machine without a GPU. Not a substitute for
# test/unit/ops/cuda on a GPU (no memory model, no asynchrony, no real cuBLAS).
# usage: test/unit/ops/cuda/emulate/run.sh [BUILD_DIR (build)] — needs libtrident_ops.a and
# libtrident_core.a built there (make build), g++ (C++17, x86-64) and OpenBLAS.
# The whole program on the emulated backend (runtime.device = "cuda" in real training, with
# the host side of src/ops/cuda on a CPU shim of the CUDA runtime and cuBLAS, checked by
# test/mpi/device_layouts.py and test/oracle/grad_oracle.py): train.sh here (manual, ~2 min).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../../../.." && pwd)
build=$(cd "${1:-$src/build}" && pwd)
work=$build/cuda-emulate
[ -f "$build/libtrident_ops.a" ] || { echo "emulate: no $build/libtrident_ops.a (make build first)" >&2; exit 2; }
blas_inc=$(sed -n 's/^OPENBLAS_INCLUDE_DIR:PATH=//p' "$build/CMakeCache.txt")
blas_lib=$(sed -n 's/^OPENBLAS_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")

rm -rf "$work"
mkdir -p "$work"
cp "$here"/shim/check.hpp "$src"/src/ops/cuda/common.cuh "$src"/src/ops/cuda/kernels.hpp \
   "$src"/src/ops/cuda/plans.hpp "$src"/src/ops/cuda/fused_head.hpp "$work/"
objs=()
for cu in "$src"/src/ops/cuda/*.cu; do
  name=$(basename "$cu" .cu)
  # k<<<grid, block, 0, s>>>(args) -> emu_launch(k, "k", grid, block, args)
  sed -e 's/\b\([a-z_0-9]*_kernel\)<<<\(.*\), 0, s>>>(/emu_launch(\1, "\1", \2, /' "$cu" >"$work/$name.cpp"
  if grep -q '<<<' "$work/$name.cpp"; then
    echo "emulate: a launch in $cu is not of the form k<<<grid, block, 0, s>>>(...)" >&2
    exit 2
  fi
  g++ -std=c++17 -O1 -ffp-contract=off -I"$here/shim" -I"$work" -c "$work/$name.cpp" -o "$work/$name.o"
  objs+=("$work/$name.o")
done
for shim in emu runtime cublas; do
  g++ -std=c++17 -O1 -ffp-contract=off -I"$here/shim" -c "$here/shim/$shim.cpp" -o "$work/shim-$shim.o"
  objs+=("$work/shim-$shim.o")
done
# The LM head's host side (fused_head.cpp: its products on the cuBLAS shim), with the real
# check.hpp beside it (check.cpp) and the per-op timer it names.
for host in fused_head op_timer check; do
  g++ -std=c++17 -O1 -ffp-contract=off -I"$here/shim" -I"$src/include" -c "$src/src/ops/cuda/$host.cpp" \
      -o "$work/host-$host.o"
  objs+=("$work/host-$host.o")
done
g++ -std=c++17 -O1 -ffp-contract=off -I"$here/shim" -I"$work" -I"$src/include" -I"$blas_inc" "$here/driver.cpp" \
    "${objs[@]}" "$build/libtrident_ops.a" "$build/libtrident_core.a" "$blas_lib" -fopenmp \
    -pthread -o "$work/emulate"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$work/emulate"
# The tensor-core attention once more with exact "bf16" (a float: shim/cuda_bf16.h), checked
# against fp32 at fp32's tolerance: its logic apart from its rounding.
g++ -std=c++17 -O1 -ffp-contract=off -DTRIDENT_EMU_BF16_EXACT -I"$here/shim" -I"$work" \
    -c "$work/flash_attention_tc.cpp" -o "$work/flash_attention_tc-exact.o"
exact_objs=("${objs[@]/#$work\/flash_attention_tc.o/$work/flash_attention_tc-exact.o}")
g++ -std=c++17 -O1 -ffp-contract=off -I"$here/shim" -I"$work" -I"$src/include" -I"$blas_inc" "$here/driver.cpp" \
    "${exact_objs[@]}" "$build/libtrident_ops.a" "$build/libtrident_core.a" "$blas_lib" -fopenmp \
    -pthread -o "$work/emulate-exact"
echo "emulate: the tensor-core attention with exact bf16 (TRIDENT_EMU_BF16_EXACT)"
TRIDENT_EMU_BF16_EXACT=1 OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$work/emulate-exact" |
  sed -n -e '/^flash tc/,/^xent/{/^xent/!p}' -e '/agree\|MISMATCH/p'
exit "${PIPESTATUS[0]}"
