#!/usr/bin/env bash
# bench/gpu_bundle_bare_check.sh — whether a bundle (bench/gpu_bundle.sh) runs trident on a
# machine without MPI, as the GPU machine's image is: here, as root, in a private mount
# namespace (unshare -m) where the system's Open MPI, PMIx, their configuration and help texts,
# libmpi, libhdf5 and orterun are hidden (tmpfs over the folders, /dev/null over the files),
# with the environment bench/gpu_check.sh gives the bundle. It runs trident as one rank without
# mpirun, then three multi-rank tests on the CPU (pipelines, ZB-V, 3D) under the bundle's
# mpirun. No GPU needed; about a minute.
# usage: bench/gpu_bundle_bare_check.sh [BUNDLE]   (default build-gpu/bundle.tar.xz)
set -euo pipefail

src=$(cd "$(dirname "$0")/.." && pwd)
archive=${1:-$src/build-gpu/bundle.tar.xz}
[ -f "$archive" ] || { echo "gpu_bundle_bare_check: no bundle at $archive (bench/gpu_bundle.sh)" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || { echo "gpu_bundle_bare_check: needs root (unshare -m, mounts)" >&2; exit 2; }
work=$(mktemp -d /tmp/bundle-bare.XXXXXX)
trap 'rm -rf "$work"' EXIT
tar -xJf "$archive" -C "$work"
export BUNDLE=$work/bundle SRC=$src OUT_DIR=$work/out

# shellcheck disable=SC2016  # expanded inside the namespace
unshare -m bash -c '
  set -euo pipefail
  lib=/usr/lib/x86_64-linux-gnu
  for d in $lib/openmpi $lib/pmix2 /usr/share/openmpi /usr/share/pmix /etc/openmpi; do
    [ -d "$d" ] && mount -t tmpfs none "$d"
  done
  for f in /usr/bin/orterun /usr/bin/orted /usr/bin/prterun $lib/libmpi.so.40 \
           $lib/libopen-rte.so.40 $lib/libopen-pal.so.40 $lib/libhdf5_openmpi.so.103; do
    [ -e "$f" ] && mount --bind /dev/null "$(readlink -f "$f")"
  done
  p=$BUNDLE
  # as bench/gpu_check.sh sets them for PREBUILT
  export LD_LIBRARY_PATH=$p/lib PATH=$p/bin:$PATH
  export OMPI_MCA_mca_base_component_path=$p/openmpi/plugins OMPI_MCA_mca_base_component_show_load_errors=0
  export OMPI_MCA_ess_singleton_isolated=1 PMIX_MCA_mca_base_component_path=$p/openmpi/pmix-plugins
  export OPAL_PKGDATADIR=$p/openmpi/share OMPI_MCA_mca_base_param_files=$p/openmpi/openmpi-mca-params.conf
  export OMPI_MCA_btl_vader_single_copy_mechanism=none
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  [ "$(command -v mpirun)" = "$p/bin/mpirun" ] || { echo "FAIL: mpirun is not the bundle'"'"'s"; exit 1; }
  "$p/trident" --version
  for t in pipeline_uneven pipeline_zbv three_d; do
    TRIDENT=$p/trident TRIDENT_TEST_OUT=$OUT_DIR timeout 300 /usr/bin/python3 "$SRC/test/mpi/$t.py" |
      tail -n 1
  done
'
echo "gpu_bundle_bare_check: PASS (the bundle runs trident, one rank and under its own mpirun, without the system's MPI)"
