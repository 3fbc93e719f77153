#!/usr/bin/env bash
# bench/gpu_bundle.sh — builds what bench/gpu_check.sh runs (sm_90) on a machine that has all
# of trident's dependencies but no GPU, and gathers it with the host libraries a bare CUDA
# machine lacks (OpenBLAS and its Fortran runtime, OpenMP, libstdc++) into build-gpu/bundle/
# (about 45 MB). On the GPU machine, with that folder carried along:
#   PREBUILT=build-gpu/bundle bench/gpu_check.sh
# The CUDA libraries (cudart, cuBLAS) are not bundled: the GPU machine's CUDA 13 provides them.
# usage: bench/gpu_bundle.sh        knobs: JOBS (nproc), BUILD (build-gpu)
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$src/build-gpu}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
targets=(trident_unit_ops_cuda trident_bench_cublas trident_bench_cuda_step)

cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DTRIDENT_CUDA=ON
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"

bundle=$build/bundle
rm -rf "$bundle"
mkdir -p "$bundle/lib"
cp "$build/test/trident_unit_ops_cuda" "$build/bench/trident_bench_cublas" \
   "$build/bench/trident_bench_cuda_step" "$bundle/"
for lib in libopenblas.so.0 libgfortran.so.5 libquadmath.so.0 libgomp.so.1 libstdc++.so.6 \
           libgcc_s.so.1; do
  path=$(ldd "$bundle/trident_unit_ops_cuda" | awk -v l="$lib" '$1 == l { print $3 }')
  if [ -n "$path" ]; then
    cp -L "$path" "$bundle/lib/"
  else
    echo "gpu_bundle: $lib is not linked by the test binary; not bundled" >&2
  fi
done
git -C "$src" rev-parse HEAD >"$bundle/COMMIT" 2>/dev/null || echo unknown >"$bundle/COMMIT"
du -sh "$bundle"
echo "bundle ready: carry ${bundle#"$src"/}; on the GPU machine: PREBUILT=${bundle#"$src"/} bench/gpu_check.sh"
