#!/usr/bin/env bash
# test/unit/ops/cuda/emulate/train.sh — the whole trident program with runtime.device = "cuda"
# on a machine without a GPU: src/ops/cuda (the kernels, rewritten as run.sh does, and the
# host side: CudaOps, cuBLAS calls, CudaMemory, device selection) compiled against shim/ (a
# CPU stand-in for the CUDA runtime and cuBLAS: cuda_runtime_api.h, cublas_v2.h say what it
# models) and linked with the CPU build's libraries into build-emu/trident. Then
#   test/mpi/device_layouts.py  with TRIDENT_TEST_DEVICE=cuda (every layout against "cpu")
#   test/oracle/grad_oracle.py  with TRIDENT_TEST_DEVICE=cuda (gradients against PyTorch)
#   test/oracle/cp_oracle.py    the same for context parallelism (the ring and Ulysses on
#                               device memory)
#   emulate/op_timing.py        the per-op timing table (TRIDENT_OP_TIMING; ~5 s)
#   emulate/weight_cache.py     the bf16 weight cache against no cache, bit for bit (~40 s)
#   emulate/cudnn_fallback.py   cuDNN attention's loader and fallback line (~10 s)
#   emulate/cuda_graphs.py      runtime.cuda_graphs against eager, bit for bit; capture failures (~25 s)
#   emulate/attention_bf16.cpp  the bf16 attention entry points against the CPU (~1 s)
#   emulate/lt_tune.py          TRIDENT_CUDA_LT_TUNE in training: bit for bit, its file (~60 s)
# with a fake nvidia-smi on PATH (the scripts ask it whether a GPU is visible).
# First shim/selftest.cpp checks the shim itself, and fused_block.cpp the fused GPT-2 block
# (CudaOps::gpt2_block_*, bf16 activations) against the CPU composition, llama_block.cpp
# the fused Llama block (CudaOps::llama_block_*) the same way, executor_memory.cpp the
# executor's allocations on the fused block's stash against predict_memory. A check of the
# backend's host code, its use of cuBLAS and the runtime (argument checks; every pointer
# handed to cuBLAS, a kernel or a copy must be device memory; fresh device memory is NaN) and
# of the device-buffer plumbing of the model, pipeline and MPI staging, in real training,
# with the real kernels.
# Not a GPU, and not modelled: asynchrony (every call is complete on return, so a missing
# synchronization cannot show), concurrency (one OS thread runs a launch: no data races),
# cuBLAS's summation order and rounding (shim/cublas_v2.h), nvcc's FMA contraction (the
# kernels are built with -ffp-contract=off), several GPUs, ranks sharing one GPU's memory
# (each process has its own 4 GiB device), host code reading device memory directly (the
# "cpu-guarded" device checks that), a CUDA-aware MPI (the local one decides; staging is what
# a non-CUDA-aware one exercises). x86-64 only (the fibers' context switch).
# A manual script, not a CTest test: on 2 cores about 15 s to build and 90 s to run
# (device_layouts ~80 s, grad_oracle ~10 s), over the budget of the regular suite.
# usage: test/unit/ops/cuda/emulate/train.sh [BUILD_DIR (build-cpu)] [--build-only]
#   BUILD_DIR: a CPU build (cmake -DTRIDENT_CUDA=OFF, `trident` built). Output: build-emu/
#   (TRIDENT_EMU_OUT overrides). Needs g++ (x86-64), mpirun, and python3 (TRIDENT_PYTHON
#   overrides) with numpy, h5py and torch.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../../../.." && pwd)
build=$(cd "${1:-$src/build-cpu}" && pwd)
only_build=${2:-}
work=${TRIDENT_EMU_OUT:-$src/build-emu}
link="$build/CMakeFiles/trident.dir/link.txt"
if [ ! -f "$link" ] || [ ! -f "$build/libtrident_ops.a" ]; then
  echo "emulate/train: no CPU build in $build (cmake -DTRIDENT_CUDA=OFF, then build)" >&2
  exit 2
fi
grep -q '^TRIDENT_CUDA:BOOL=OFF' "$build/CMakeCache.txt" ||
  { echo "emulate/train: $build is not configured with -DTRIDENT_CUDA=OFF" >&2; exit 2; }

start=$SECONDS
rm -rf "$work"
mkdir -p "$work/gen" "$work/obj" "$work/bin"
# The kernels' private headers, with the real check.hpp (check.cpp is compiled below).
cp "$src"/src/ops/cuda/{check.hpp,common.cuh,kernels.hpp,plans.hpp} "$work/gen/"
flags=(-std=c++17 -O2 -g -fPIC -fno-math-errno -ffp-contract=off -DTRIDENT_EMU_DEVICE_POINTERS
       -isystem "$here/shim" -I"$src/include")
warn=(-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion)
jobs=()
compile() {  # compile SOURCE OBJECT [FLAGS...]: in the background, two at a time
  local in=$1 out=$2
  shift 2
  if [ "${#jobs[@]}" -ge 2 ]; then wait "${jobs[0]}"; jobs=("${jobs[@]:1}"); fi
  g++ "${flags[@]}" "$@" -c "$in" -o "$out" &
  jobs+=("$!")
}
for cu in "$src"/src/ops/cuda/*.cu; do
  name=$(basename "$cu" .cu)
  # k<<<grid, block, 0, s>>>(args) -> emu_launch(k, "k", grid, block, args)
  sed -e 's/\b\([a-z_0-9]*_kernel\)<<<\(.*\), 0, s>>>(/emu_launch(\1, "\1", \2, /' "$cu" >"$work/gen/$name.cpp"
  if grep -q '<<<' "$work/gen/$name.cpp"; then
    echo "emulate/train: a launch in $cu is not of the form k<<<grid, block, 0, s>>>(...)" >&2
    exit 2
  fi
  compile "$work/gen/$name.cpp" "$work/obj/kernel-$name.o" -I"$work/gen"
done
# cudnn_attention.cpp with the real cuDNN headers where they are (shim/library_types.h stands
# in for the one that would clash with the cuBLAS shim): the stand-in then runs the real
# loader (dlopen, version, cudnnCreate) and the fallback to trident's kernel; the stub without.
cudnn_inc=""
for d in /usr/local/cuda/include /usr/include; do
  [ -f "$d/cudnn_graph.h" ] && { cudnn_inc=$d; break; }
done
for cpp in "$src"/src/ops/cuda/*.cpp; do
  extra=()
  if [ "$(basename "$cpp")" = cudnn_attention.cpp ] && [ -n "$cudnn_inc" ]; then
    extra=(-DTRIDENT_HAVE_CUDNN=1 -DTRIDENT_CUDNN_STAND_IN=1 -idirafter "$cudnn_inc")
  fi
  compile "$cpp" "$work/obj/host-$(basename "$cpp" .cpp).o" "${warn[@]}" "${extra[@]}"
done
# Backend selection with CUDA on (the CPU build's libtrident_ops.a has it off).
compile "$src/src/ops/ops.cpp" "$work/obj/ops.o" -DTRIDENT_HAVE_CUDA=1 "${warn[@]}"
for shim in emu runtime cublas; do
  compile "$here/shim/$shim.cpp" "$work/obj/shim-$shim.o"
done
compile "$here/shim/selftest.cpp" "$work/selftest.o"
for j in "${jobs[@]}"; do wait "$j"; done
g++ "$work/selftest.o" "$work"/obj/shim-*.o -o "$work/selftest"
# The CPU build's link line of trident, with these objects ahead of its libraries.
objs=("$work"/obj/*.o)
read -r -a cmd <"$link"
out=()
for ((i = 0; i < ${#cmd[@]}; i++)); do
  case ${cmd[i]} in
    -o) out+=(-o "$work/trident"); i=$((i + 1)) ;;
    libtrident_train.a) out+=("${objs[@]}" "${cmd[i]}") ;;
    *) out+=("${cmd[i]}") ;;
  esac
done
(cd "$build" && "${out[@]}")
# nvidia-smi -L, as device_layouts.py and grad_oracle.py ask it whether a GPU is visible
cat >"$work/bin/nvidia-smi" <<'EOF'
#!/bin/sh
# emulate/train.sh's stand-in: one GPU, the CPU shim of the CUDA runtime
echo "GPU 0: emulated GPU (trident CPU shim) (UUID: GPU-emulated)"
EOF
chmod +x "$work/bin/nvidia-smi"
echo "emulate/train: built $work/trident in $((SECONDS - start)) s"
"$work/selftest"
blas_lib=$(sed -n 's/^OPENBLAS_LIBRARY:FILEPATH=//p' "$build/CMakeCache.txt")
# The bf16 attention entry points (CudaOps::attention_forward_bf16) on these objects.
g++ "${flags[@]}" "${warn[@]}" -I"$src/src/ops/cuda" "$here/attention_bf16.cpp" "${objs[@]}" \
    "$build/libtrident_ops.a" "$build/libtrident_core.a" "$blas_lib" -fopenmp -ldl -pthread \
    -o "$work/attention_bf16"
# The fused GPT-2 block (src/ops/cuda/fused_block.cpp) against the CPU composition: the
# backend's host objects with the CPU build's ops and core libraries.
g++ "${flags[@]}" "${warn[@]}" "$here/fused_block.cpp" "${objs[@]}" "$build/libtrident_ops.a" \
    "$build/libtrident_core.a" "$blas_lib" -fopenmp -ldl -pthread -o "$work/fused_block"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$work/fused_block"
# The fused Llama block (the same file's llama_block_*) the same way.
g++ "${flags[@]}" "${warn[@]}" "$here/llama_block.cpp" "${objs[@]}" "$build/libtrident_ops.a" \
    "$build/libtrident_core.a" "$blas_lib" -fopenmp -ldl -pthread -o "$work/llama_block"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$work/llama_block"
# TRIDENT_CUDA_LT_TUNE (src/ops/cuda/lt_tune.hpp): bias_lt's plans tuned, bit for bit, and the file.
g++ "${flags[@]}" "${warn[@]}" -I"$src/src/ops/cuda" "$here/lt_tune.cpp" "${objs[@]}" \
    "$build/libtrident_ops.a" "$build/libtrident_core.a" "$blas_lib" -fopenmp -ldl -pthread \
    -o "$work/lt_tune"
(cd "$work" && OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$work/lt_tune")
# The executor's activation memory on the fused block's bf16 stash (and the zero-bubble split
# backward's W stash) against predict_memory, byte for byte: with the model, pipeline and
# parallel libraries (and MPI's, which size-1 communicators do not call).
mpi_inc=$(sed -n 's/^MPI_CXX_COMPILER_INCLUDE_DIRS:STRING=//p' "$build/CMakeCache.txt" | tr ';' ' ')
mpi_libs=$(tr ' ' '\n' <"$link" | grep -E 'libmpi(_cxx)?\.so$' | tr '\n' ' ')
# shellcheck disable=SC2046,SC2086
g++ "${flags[@]}" "${warn[@]}" $(printf -- '-isystem %s ' $mpi_inc) "$here/executor_memory.cpp" \
    "${objs[@]}" "$build"/libtrident_{pipeline,model,parallel}.a $mpi_libs \
    "$build/libtrident_ops.a" "$build/libtrident_core.a" "$blas_lib" -fopenmp -ldl -pthread \
    -o "$work/executor_memory"
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 "$work/executor_memory"
[ "$only_build" = --build-only ] && exit 0

export TRIDENT="$work/trident" TRIDENT_TEST_DEVICE=cuda TRIDENT_TEST_OUT="$work/test-out"
export PATH="$work/bin:$PATH" TRIDENT_SOURCE_DIR="$src" OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$TRIDENT_TEST_OUT"
status=0
"$work/attention_bf16" || { echo "emulate/train: attention_bf16 failed"; status=1; }
for t in test/mpi/device_layouts.py test/oracle/grad_oracle.py test/oracle/cp_oracle.py \
         test/unit/ops/cuda/emulate/op_timing.py \
         test/unit/ops/cuda/emulate/weight_cache.py \
         test/unit/ops/cuda/emulate/lt_tune.py \
         test/unit/ops/cuda/emulate/cudnn_fallback.py \
         test/unit/ops/cuda/emulate/cuda_graphs.py; do
  t0=$SECONDS
  rc=0
  "${TRIDENT_PYTHON:-python3}" "$src/$t" || rc=$?
  echo "emulate/train: $t exit $rc in $((SECONDS - t0)) s"
  [ "$rc" -eq 0 ] || status=1
done
echo "emulate/train: total $((SECONDS - start)) s"
exit "$status"
