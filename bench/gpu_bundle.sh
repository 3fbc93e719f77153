#!/usr/bin/env bash
# bench/gpu_bundle.sh — builds what bench/gpu_check.sh runs (sm_90) on a machine that has all
# of trident's dependencies but no GPU, and gathers it with the host libraries a bare CUDA
# machine lacks into build-gpu/bundle/, packed as build-gpu/bundle.tar.xz (~25 MB; the folder
# is ~85 MB, over what a device run carries). On the GPU machine, with the archive carried:
#   PREBUILT=build-gpu/bundle.tar.xz bench/gpu_check.sh
# What is in it:
#   * trident with its CUDA backend module beside it (libtrident_cuda.so: trident dlopens it
#     from its own folder for runtime.device = "cuda"), trident_unit_ops_cuda,
#     trident_bench_cublas, trident_bench_cuda_step, trident_cudnn_probe,
#     trident_bench_cuda_attention (cuDNN itself is not bundled: gpu_check.sh finds the
#     machine's, or PyTorch's);
#   * lib/: every shared library they (and Open MPI's plugins) load, found with ldd, except
#     glibc's own and CUDA's (cudart, cuBLAS: the GPU machine's CUDA 13 provides them):
#     Open MPI, HDF5 (openmpi flavour), SentencePiece, toml++, OpenBLAS, libgomp, libstdc++...;
#   * openmpi/plugins and openmpi/pmix-plugins: Open MPI's MCA components (dlopen'ed from the
#     install prefix, which a bare machine lacks). gpu_check.sh points Open MPI at them
#     (OMPI_MCA_mca_base_component_path, PMIX_MCA_mca_base_component_path) and sets
#     OMPI_MCA_ess_singleton_isolated=1, so `trident train deck.toml` runs as one rank with no
#     mpirun and no orted (checked here with strace: nothing is loaded from the system's Open
#     MPI then, one process);
#   * bin/mpirun (Open MPI's orterun) and openmpi/share (its help texts): the GPU machine's
#     image has no MPI, and the multi-rank steps (device_layouts, issue 29's pipeline_pp4) need
#     a launcher of the same Open MPI as the bundle's libmpi, and openmpi-mca-params.conf (the
#     install's component choices). gpu_check.sh puts bin/ first on PATH, OPAL_PKGDATADIR at
#     the help texts and OMPI_MCA_mca_base_param_files at the choices. Checked here with the
#     system's Open MPI, PMIx and HDF5 hidden (unshare -m, tmpfs over their folders, /etc/openmpi
#     included): mpi.pipeline_uneven and mpi.pipeline_zbv pass with the bundle's mpirun and
#     trident (without the choices, pipeline_zbv's pp 2 messages never arrived):
#     bench/gpu_bundle_bare_check.sh runs that check on a bundle.
# usage: bench/gpu_bundle.sh        knobs: JOBS (nproc), BUILD (build-gpu)
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$src/build-gpu}
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
targets=(trident trident_cuda trident_unit_ops_cuda trident_bench_cublas trident_bench_cuda_step
         trident_cudnn_probe trident_bench_cuda_attention)

cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DTRIDENT_CUDA=ON
cmake --build "$build" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"

bundle=$build/bundle
rm -rf "$bundle" "$build/bundle.tar.xz"
mkdir -p "$bundle/lib" "$bundle/openmpi"
cp "$build/trident" "$build/libtrident_cuda.so" "$build/test/trident_unit_ops_cuda" \
   "$build/bench/trident_bench_cublas" "$build/bench/trident_bench_cuda_step" \
   "$build/trident_cudnn_probe" "$build/bench/trident_bench_cuda_attention" "$bundle/"

# Open MPI's plugins (and PMIx's), as installed here
ompi_plugins=$(ompi_info --parsable --path pkglibdir 2>/dev/null | sed -n 's/^path:pkglibdir://p')
if [ -n "$ompi_plugins" ] && [ -d "$ompi_plugins" ]; then
  cp -rL "$ompi_plugins" "$bundle/openmpi/plugins"
  pmix_lib=$(ldd "$ompi_plugins"/mca_pmix_*.so 2>/dev/null | awk '$1 ~ /^libpmix\.so/ { print $3; exit }')
  [ -z "$pmix_lib" ] || pmix_lib=$(readlink -f "$pmix_lib")
  if [ -n "$pmix_lib" ] && [ -d "$(dirname "$pmix_lib")/pmix" ]; then
    cp -rL "$(dirname "$pmix_lib")/pmix" "$bundle/openmpi/pmix-plugins"
  fi
else
  echo "gpu_bundle: no Open MPI plugin folder (ompi_info --path pkglibdir); trident will need the GPU machine's Open MPI" >&2
fi

# Open MPI's launcher, for the multi-rank steps: a single node needs no orted (mpirun starts
# the ranks itself), only the plugins above and, for readable errors, the help texts
ompi_bin=$(ompi_info --parsable --path bindir 2>/dev/null | sed -n 's/^path:bindir://p')
ompi_data=$(ompi_info --parsable --path pkgdatadir 2>/dev/null | sed -n 's/^path:pkgdatadir://p')
if [ -n "$ompi_bin" ] && [ -x "$ompi_bin/orterun" ]; then
  mkdir -p "$bundle/bin"
  cp -L "$ompi_bin/orterun" "$bundle/bin/mpirun"
  [ -z "$ompi_data" ] || [ ! -d "$ompi_data" ] || cp -rL "$ompi_data" "$bundle/openmpi/share"
  # the install's component choices (Debian's: no ofi MTL, no UCX PML, no uct/openib/ofi
  # BTLs): without them a bare machine's Open MPI picked components under which pipeline
  # messages never arrived (mpi.pipeline_zbv hung in the bare-machine check)
  ompi_etc=$(ompi_info --parsable --path sysconfdir 2>/dev/null | sed -n 's/^path:sysconfdir://p')
  if [ -f "$ompi_etc/openmpi-mca-params.conf" ]; then
    cp -L "$ompi_etc/openmpi-mca-params.conf" "$bundle/openmpi/openmpi-mca-params.conf"
  fi
else
  echo "gpu_bundle: no orterun in Open MPI's bindir: the multi-rank steps will need the GPU machine's mpirun" >&2
fi

# every library the binaries and plugins load, but glibc's and CUDA's
shopt -s nullglob
objects=("$bundle"/trident* "$bundle"/libtrident_cuda.so "$bundle"/bin/* "$bundle"/openmpi/plugins/*.so "$bundle"/openmpi/pmix-plugins/*.so)
ldd "${objects[@]}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
  while read -r name path; do
    case $name in
      libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | libresolv.so.* | \
      libutil.so.* | ld-linux*) continue ;;
      libcuda.so.* | libcudart.so.* | libcublas*.so.* | libnvidia*) continue ;;
    esac
    [ -e "$bundle/lib/$name" ] || cp -L "$path" "$bundle/lib/$name"
  done
git -C "$src" rev-parse HEAD >"$bundle/COMMIT" 2>/dev/null || echo unknown >"$bundle/COMMIT"
tar -C "$build" -cJf "$build/bundle.tar.xz" bundle
du -sh "$bundle" "$build/bundle.tar.xz"
echo "bundle ready: carry ${build#"$src"/}/bundle.tar.xz; on the GPU machine:"
echo "  PREBUILT=${build#"$src"/}/bundle.tar.xz bench/gpu_check.sh"
