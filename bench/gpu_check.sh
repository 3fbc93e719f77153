#!/usr/bin/env bash
# bench/gpu_check.sh — everything trident's CUDA backend needs checked on a real GPU, in one
# run sized for one H100 or H200 (a few minutes; under 10: the steps after the build share a time
# budget, BUDGET_S, and each is bounded by what is left of it):
#   0. the machine: bench/gpu_probe.py (GPU, driver, CUDA runtime, cuBLASLt, every libcudnn and
#      its cudnnGetVersion, PyTorch's CUDA and cuDNN), env_probe.json;
#   1. configure and build for sm_90 into build-gpu/ (only the targets below, trident included);
#   1b. cuDNN (issue 27, step 1): where libcudnn.so.9 is (the loader's path, /usr/local/cuda,
#      PyTorch's nvidia/cudnn: exported as TRIDENT_CUDNN_LIBRARY with its folder on
#      LD_LIBRARY_PATH when the loader alone would not find it), and trident_cudnn_probe: the
#      causal bf16 attention graphs for GPT-2 small built and planned, or the first failing
#      call (cudnn_probe.log);
#   2. the CUDA op tests (test/unit/ops/cuda: every op against the CPU backend, fp32/tf32/bf16,
#      and the device arena, CudaMemory; cuDNN attention against the CPU, required to run
#      when the probe made its plans: TRIDENT_TEST_EXPECT_CUDNN=1);
#   3. the other CTest tests labelled cuda (ctest -L cuda, e.g. test/mpi/device_layouts.py with
#      TRIDENT_TEST_DEVICE=cuda); with PREBUILT, the bundle's trident runs
#      test/mpi/device_layouts.py directly, under the bundle's mpirun;
#   3b. the per-op timing's check with CUDA events (test/unit/ops/cuda/emulate/op_timing.py)
#      and the bf16 weight cache's (emulate/weight_cache.py: cached = uncached, bit for bit),
#      cuDNN attention's fallback line and whether it ran in training (cudnn_fallback.py),
#      runtime.cuda_graphs against eager training bit for bit (cuda_graphs.py);
#   3c. causal bf16 attention at B 8, T 1024, NH 12, hs 64 by each path: cuDNN, trident's
#      tensor-core kernels, its scalar ones (trident_bench_cuda_attention), and PyTorch's SDPA
#      where torch sees the GPU (bench/gpu_attention_torch.py): ms and TFLOP/s forward and
#      backward, and whether each path ran;
#   4. cuBLAS GEMM rates on GPT-2 small/medium shapes (bench/cublas_gemm_bench.cpp);
#   5. an op-level step estimate through the CUDA backend (bench/cuda_step_bench.cpp);
#   6. `trident train` end to end on the GPU, GPT-2 small and medium in bf16: tokens/s and MFU
#      (bench/gpu_train_bench.py; trident runs as a single rank without mpirun);
#   6b. the same-machine peer: PyTorch on this GPU, the same GPT-2 small and medium and the same
#      step (bench/gpu_torch_peer.py: bf16 autocast, SDPA, fused AdamW), MFU against the same
#      assumed peak, and trident's step over PyTorch's (issue 27 asks for <= 0.8);
#   6c. the per-op table of one steady GPT-2 small step (bench/gpu_op_table.py: TRIDENT_OP_TIMING),
#      now and with TRIDENT_CUDA_BASELINE=1 (the paths before issue 27): before/after; and the
#      events' sum over 6's wall-clock step (what is left: launch gaps, host work, syncs);
#   6d. the same steady step with TRIDENT_CUDA_LT_TUNE=1 (each cuBLASLt plan's algorithm timed
#      among the heuristic's candidates; src/ops/cuda/lt_tune.hpp) against 6c's "now" (unset),
#      lt_tune/op_table.json, and the tuning's own line (shapes, ms) from its log;
#   6e. GPT-2 small's step without and with runtime.cuda_graphs (gpu_train_bench.py
#      --cuda-graphs, 8 steps each): both step times, the losses bit for bit (graphs_bench/;
#      after the figures issue 27 asks for, which it must not starve);
#   7. with PIPELINE_BEFORE (another trident), the pipeline's idle time at pp = 4 before and
#      after on the CPU cores (bench/pipeline_bench.py --compare);
#   8. compute-sanitizer memcheck, racecheck and synccheck over trident's own kernels
#      (time-bounded);
#   9. issue 29's pipeline figures at pp 4 on the machine's CPU cores (bench/pipeline_bench.py:
#      idle per schedule against the simulator, the auto split against the even one).
# They run in this order: 0, 1, then 9 in the background on four CPUs of its own (every other
# step on the rest; it needs no GPU, and last it would find the budget spent), 1b, 2, 3c, 4, 5,
# 6, 6b, 6c, 6d, 6e, then 3 and 3b, 7, 8: the figures before the longer checks in training, so that
# these cannot spend the budget the figures need.
# Writes summary.txt and summary.json (and each step's log and output) to $OUT when set, else
# to build-gpu/gpu-check/. Each step runs even if an earlier one failed (where it can); the
# script ends with a table of the steps and exits 1 if any failed.
# Where trident's host dependencies (MPI, HDF5, OpenBLAS, GoogleTest...) are missing, the
# configure step fails and only the GEMM benchmark runs, built with a bare nvcc; to run
# everything there, build a bundle where the dependencies are (bench/gpu_bundle.sh), carry
# build-gpu/bundle.tar.xz (or the folder build-gpu/bundle), and set
# PREBUILT=build-gpu/bundle.tar.xz (no build step then; a .tar.xz is unpacked into $BUILD).
# usage: bench/gpu_check.sh   knobs: PREBUILT, JOBS (nproc), BUILD (build-gpu), GEMM_REPS (20),
#        STEP_REPS (5), SANITIZE (1), MEMCHECK_TIMEOUT (100 s), RACECHECK_TIMEOUT (45 s),
#        SYNCCHECK_TIMEOUT (30 s), CTEST_TIMEOUT (120 s), TRAIN_BENCH (1), TRAIN_BENCH_TIMEOUT (200 s), BUDGET_S (520 s:
#        the steps after the build together), PYTHON (python3), PIPELINE_BEFORE (unset),
#        PIPELINE_TIMEOUT (120 s), PEER (1), PEER_TIMEOUT (100 s), PEER_COMPILE (0: also a
#        torch.compile'd peer when 1), OP_TABLE (1), OP_TABLE_TIMEOUT (120 s),
#        PIPELINE_PP4 (1), PIPELINE_PP4_TIMEOUT (300 s: in the background, not out of BUDGET_S),
#        PIPELINE_PP4_MIN_CPUS (8), LT_TUNE (1), LT_TUNE_TIMEOUT (60 s), GRAPHS_BENCH (1),
#        GRAPHS_BENCH_TIMEOUT (90 s)
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
  record "$name" "$rc"
}

# record NAME RC: a finished step's status from its exit code.
record() {
  local name=$1 rc=$2
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

# bounded SECONDS: SECONDS, or what is left of the time budget when less (0: none left). The
# budget starts after the build (set_budget).
deadline=0
set_budget() { deadline=$((SECONDS + ${BUDGET_S:-520})); }
bounded() {
  local want=$1 left=$((deadline - SECONDS))
  if [ "$left" -lt 20 ]; then echo 0; elif [ "$left" -lt "$want" ]; then echo "$left"; else echo "$want"; fi
}
python=${PYTHON:-python3}

# ---- the machine ---------------------------------------------------------------------------
step gpu_info nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
step env_probe "$python" "$src/bench/gpu_probe.py" --out "$out/env_probe.json"

# ---- build (or a bundle built elsewhere: bench/gpu_bundle.sh) ---------------------------------
configure() {
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DTRIDENT_CUDA=ON
}
build_targets() {
  cmake --build "$build" -j "$jobs" --target trident trident_cuda trident_unit_ops_cuda \
        trident_bench_cublas trident_bench_cuda_step trident_cudnn_probe \
        trident_bench_cuda_attention
}
# Only the cuBLAS benchmark, without trident's CMake (its dependencies are absent).
build_gemm_bench_bare() {
  mkdir -p "$build/bench"
  nvcc -O2 -std=c++17 -arch=sm_90 "$src/bench/cublas_gemm_bench.cpp" -lcublas \
       -o "$build/bench/trident_bench_cublas"
}

if [ -n "${PREBUILT:-}" ]; then
  if [ -f "$PREBUILT" ]; then  # bundle.tar.xz (bench/gpu_bundle.sh): unpacked next to the build
    mkdir -p "$build"
    rm -rf "$build/bundle-unpacked"
    mkdir -p "$build/bundle-unpacked"
    tar -xJf "$PREBUILT" -C "$build/bundle-unpacked"
    prebuilt=$build/bundle-unpacked/bundle
  else
    prebuilt=$(cd "$PREBUILT" && pwd)
  fi
  skip configure "PREBUILT=$prebuilt (commit $(cat "$prebuilt/COMMIT" 2>/dev/null || echo unknown))"
  skip build "PREBUILT"
  export LD_LIBRARY_PATH="$prebuilt/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
  # Open MPI's plugins from the bundle (a bare machine has none), and a singleton that starts
  # no orted: `trident train deck` runs as one rank without mpirun.
  if [ -d "$prebuilt/openmpi/plugins" ]; then
    export OMPI_MCA_mca_base_component_path=$prebuilt/openmpi/plugins
    export OMPI_MCA_mca_base_component_show_load_errors=0
    export OMPI_MCA_ess_singleton_isolated=1
  fi
  if [ -d "$prebuilt/openmpi/pmix-plugins" ]; then
    export PMIX_MCA_mca_base_component_path=$prebuilt/openmpi/pmix-plugins
  fi
  # The bundle's mpirun (Open MPI's orterun, gpu_bundle.sh) for the multi-rank steps: first on
  # PATH even where the machine has an MPI, as the ranks load the bundle's libmpi
  if [ -x "$prebuilt/bin/mpirun" ]; then
    export PATH="$prebuilt/bin:$PATH"
    if [ -d "$prebuilt/openmpi/share" ]; then export OPAL_PKGDATADIR=$prebuilt/openmpi/share; fi
    # the install's component choices, which a bare machine lacks (gpu_bundle.sh); shared
    # memory without single-copy (CMA needs ptrace rights that containers often withhold)
    if [ -f "$prebuilt/openmpi/openmpi-mca-params.conf" ]; then
      export OMPI_MCA_mca_base_param_files=$prebuilt/openmpi/openmpi-mca-params.conf
    fi
    export OMPI_MCA_btl_vader_single_copy_mechanism=none
  fi
  tests=$prebuilt/trident_unit_ops_cuda
  gemm=$prebuilt/trident_bench_cublas
  step_bench=$prebuilt/trident_bench_cuda_step
  cudnn_probe=$prebuilt/trident_cudnn_probe
  attention_bench=$prebuilt/trident_bench_cuda_attention
  trident=$prebuilt/trident
  built=yes
else
  tests=$build/test/trident_unit_ops_cuda
  gemm=$build/bench/trident_bench_cublas
  step_bench=$build/bench/trident_bench_cuda_step
  cudnn_probe=$build/trident_cudnn_probe
  attention_bench=$build/bench/trident_bench_cuda_attention
  trident=$build/trident
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
set_budget

# Issue 29's pp 4 figures, on this machine's CPU cores (the task machines have 2): every
# schedule's measured idle against the simulator, and the auto split's step time against the
# even split's, on a model whose head dominates (vocabulary 32000, 8 layers; one core per
# rank). It needs no GPU, and it would come last in the budget, so it runs from here in the
# background on four cores of their own (one CPU per physical core, lscpu), every other step
# on the rest (taskset), and is collected at the end. PIPELINE_PP4=0 leaves it out.
pp4_pid=
pp4_start() {
  local cpus rest
  # the first CPU of each of the first four physical cores; the rest: the CPUs of other cores
  # ("-": none, then the other steps are not confined)
  read -r cpus rest < <(lscpu -p=CPU,CORE 2>/dev/null | awk -F, '
    !/^#/ { core[$1] = $2; if (!($2 in first)) { first[$2] = $1; order[n++] = $2 } }
    END { for (i = 0; i < 4 && i < n; i++) { mine[order[i]] = 1; c = c (c == "" ? "" : ",") first[order[i]] }
          for (cpu in core) if (!(core[cpu] in mine)) r[cpu] = 1
          for (cpu = 0; cpu < 4096; cpu++) if (cpu in r) rs = rs (rs == "" ? "" : ",") cpu
          print (i == 4 ? c : "0,1,2,3"), (rs == "" || i < 4 ? "-" : rs) }')
  mkdir -p "$out/pipeline_pp4/build"
  ln -sf "$trident" "$out/pipeline_pp4/build/trident"
  order+=(pipeline_pp4)
  echo "== pipeline_pp4 (in the background on CPUs $cpus; the other steps on $rest)"
  taskset -c "$cpus" timeout "${PIPELINE_PP4_TIMEOUT:-300}" env PYTHON="$python" \
      OUT="$out/pipeline_pp4" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      "$python" "$src/bench/pipeline_bench.py" --pp 4 --layers 8 --vocab 32000 \
      --splits even,auto --schedules gpipe,1f1b,zb-h1,zb-v --build "$out/pipeline_pp4/build" \
      >"$out/pipeline_pp4.log" 2>&1 &
  pp4_pid=$!
  [ "$rest" = - ] || taskset -pc "$rest" $$ >/dev/null
}
if [ "${PIPELINE_PP4:-1}" = 0 ]; then
  skip pipeline_pp4 "PIPELINE_PP4=0"
elif [ "$(nproc)" -lt "${PIPELINE_PP4_MIN_CPUS:-8}" ]; then
  skip pipeline_pp4 "fewer than ${PIPELINE_PP4_MIN_CPUS:-8} CPUs"
elif ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$trident" ]; then
  skip pipeline_pp4 "no mpirun or no trident binary"
elif ! command -v taskset >/dev/null 2>&1 || ! command -v lscpu >/dev/null 2>&1; then
  skip pipeline_pp4 "no taskset or lscpu (util-linux) to give it cores of its own"
else
  pp4_start
fi
# cuDNN for trident's attention (loaded at run time): the loader's own search first; else the
# first libcudnn.so.9 of /usr/local/cuda or PyTorch's wheel (nvidia/cudnn/lib), whose folder
# also holds the sub-libraries libcudnn.so.9 loads by name.
find_cudnn() {
  if [ -n "${TRIDENT_CUDNN_LIBRARY:-}" ]; then echo "$TRIDENT_CUDNN_LIBRARY"; return; fi
  if ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9 '; then echo "libcudnn.so.9 (loader)"; return; fi
  local d
  for d in ${LD_LIBRARY_PATH//:/ } /usr/local/cuda/lib64 /usr/local/cuda/lib \
           "$("$python" -c 'import nvidia.cudnn, os; print(os.path.join(list(nvidia.cudnn.__path__)[0], "lib"))' 2>/dev/null)"; do
    [ -n "$d" ] && [ -f "$d/libcudnn.so.9" ] && { echo "$d/libcudnn.so.9"; return; }
  done
  echo none
}
cudnn_lib=$(find_cudnn)
echo "cuDNN for trident: $cudnn_lib"
case $cudnn_lib in
  /*) export TRIDENT_CUDNN_LIBRARY=$cudnn_lib
      export LD_LIBRARY_PATH="$(dirname "$cudnn_lib"):${LD_LIBRARY_PATH:-}" ;;
esac
expect_cudnn=0
if [ "$cudnn_lib" = none ]; then
  skip cudnn_probe "no libcudnn.so.9 on this machine (trident runs its own attention kernel)"
elif [ "$built" = yes ] && [ -x "${cudnn_probe:-}" ]; then
  step cudnn_probe "$cudnn_probe" 8 1024 12 64
  [ "${status[cudnn_probe]}" = ok ] && expect_cudnn=1
else
  skip cudnn_probe "not built"
fi
if [ "$built" = yes ] && [ -x "$tests" ]; then
  # exit 77 = no GPU visible: a failure here (the point of this script is the GPU)
  step op_tests env TRIDENT_TEST_EXPECT_CUDNN=$expect_cudnn "$tests" \
       --gtest_output="json:$out/op_tests.json"
else
  skip op_tests "not built"
fi

# Attention by each path (cuDNN, tensor-core kernels, scalar kernels), GPT-2 small's shape.
if [ "$built" = yes ] && [ -x "${attention_bench:-}" ]; then
  t=$(bounded 60)
  if [ "$t" -eq 0 ]; then
    skip attention_bench "time budget spent"
  else
    step attention_bench to_file "$out/attention_bench.jsonl" timeout "$t" "$attention_bench" 10
  fi
else
  skip attention_bench "not built"
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

# PyTorch's SDPA at the attention bench's shape (step 3c), where torch sees the GPU.
if ! "$python" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  skip attention_torch "$python has no torch that sees a GPU"
else
  t=$(bounded 60)
  if [ "$t" -eq 0 ]; then
    skip attention_torch "time budget spent"
  else
    step attention_torch to_file "$out/attention_torch.jsonl" timeout "$t" "$python" \
         "$src/bench/gpu_attention_torch.py" --reps "${ATTENTION_REPS:-10}"
  fi
fi

# trident train end to end on the GPU: tokens/s and MFU for GPT-2 small and medium.
if [ "${TRAIN_BENCH:-1}" = 0 ]; then
  skip train_bench "TRAIN_BENCH=0"
elif [ ! -x "$trident" ]; then
  skip train_bench "no trident binary"
elif ! command -v "$python" >/dev/null 2>&1; then
  skip train_bench "no $python"
else
  t=$(bounded "${TRAIN_BENCH_TIMEOUT:-200}")
  if [ "$t" -eq 0 ]; then
    skip train_bench "time budget spent"
  else
    # each model's run bounded too, so that one hang still leaves the other's numbers
    step train_bench timeout "$t" "$python" "$src/bench/gpu_train_bench.py" --trident "$trident" \
         --cublas "$gemm" --out "$out/train_bench" --steps "${TRAIN_STEPS:-16}" \
         --timeout $(((t - 20) / 2))
  fi
fi

# The same-machine peer: PyTorch with the same models and step (needs torch with CUDA).
if [ "${PEER:-1}" = 0 ]; then
  skip torch_peer "PEER=0"
elif ! "$python" -c 'import torch; assert torch.cuda.is_available()' >/dev/null 2>&1; then
  skip torch_peer "$python has no torch that sees a GPU"
else
  t=$(bounded "${PEER_TIMEOUT:-100}")
  if [ "$t" -eq 0 ]; then
    skip torch_peer "time budget spent"
  else
    peer_args=()
    [ "${PEER_COMPILE:-0}" = 1 ] && peer_args+=(--compile)
    step torch_peer timeout "$t" "$python" "$src/bench/gpu_torch_peer.py" --models small,medium \
         --out "$out/torch_peer.json" "${peer_args[@]}"
  fi
fi

# One steady step's GPU time op by op (TRIDENT_OP_TIMING), now and before issue 27.
if [ "${OP_TABLE:-1}" = 0 ]; then
  skip op_table "OP_TABLE=0"
elif [ ! -x "$trident" ]; then
  skip op_table "no trident binary"
else
  t=$(bounded "${OP_TABLE_TIMEOUT:-120}")
  if [ "$t" -eq 0 ]; then
    skip op_table "time budget spent"
  else
    step op_table timeout "$t" "$python" "$src/bench/gpu_op_table.py" --trident "$trident" \
         --models small --baseline --out "$out/op_table" --timeout $(((t - 10) / 4))
  fi
fi

# TRIDENT_CUDA_LT_TUNE=1: 6c's steady step with the cuBLASLt plans' algorithms timed (at their
# first call, so in the short run's start, which the difference cancels); the tuning's own
# line of each train (shapes, ms) is in lt_tune.log.
if [ "${LT_TUNE:-1}" = 0 ]; then
  skip lt_tune "LT_TUNE=0"
elif [ ! -x "$trident" ]; then
  skip lt_tune "no trident binary"
else
  t=$(bounded "${LT_TUNE_TIMEOUT:-60}")
  if [ "$t" -eq 0 ]; then
    skip lt_tune "time budget spent"
  else
    step lt_tune env TRIDENT_CUDA_LT_TUNE=1 timeout "$t" "$python" "$src/bench/gpu_op_table.py" \
         --trident "$trident" --models small --out "$out/lt_tune" --timeout $(((t - 10) / 2))
  fi
fi

# runtime.cuda_graphs: GPT-2 small's step without and with graphs (8 steps each), both
# medians and whether the losses are equal bit for bit (graphs_bench/).
if [ "${GRAPHS_BENCH:-1}" = 0 ]; then
  skip graphs_bench "GRAPHS_BENCH=0"
elif [ ! -x "$trident" ]; then
  skip graphs_bench "no trident binary"
elif ! command -v "$python" >/dev/null 2>&1; then
  skip graphs_bench "no $python"
else
  t=$(bounded "${GRAPHS_BENCH_TIMEOUT:-90}")
  if [ "$t" -eq 0 ]; then
    skip graphs_bench "time budget spent"
  else
    step graphs_bench timeout "$t" "$python" "$src/bench/gpu_train_bench.py" --trident "$trident" \
         --out "$out/graphs_bench" --models small --steps 8 --warmup 3 --cuda-graphs \
         --timeout $(((t - 10) / 2))
  fi
fi

# The correctness checks in training (after the figures, so that a slow one cannot starve
# them of the shared budget).
# ctest -L cuda in the build tree, bounded by SECONDS (exit 124 when it runs out)
run_ctest_cuda() {
  (cd "$build" && timeout "$1" ctest -L cuda -E '^ops\.cuda$' --output-on-failure --timeout "$1")
}
# The other GPU tests CTest knows (label cuda; ops.cuda ran just above as op_tests).
if [ "$built" = yes ] && [ -z "${PREBUILT:-}" ] && [ -x "$trident" ]; then
  t=$(bounded "${CTEST_TIMEOUT:-120}")
  if [ "$t" -eq 0 ]; then
    skip ctest_cuda "time budget spent"
  elif [ -z "$(cd "$build" && ctest -N -L cuda -E '^ops\.cuda$' | sed -n 's/^Total Tests: //p' | grep -v '^0$')" ]; then
    skip ctest_cuda "no CTest test labelled cuda besides ops.cuda"
  else
    step ctest_cuda run_ctest_cuda "$t"
  fi
elif [ "$built" = yes ] && [ -x "$trident" ] && [ -f "$src/test/mpi/device_layouts.py" ]; then
  # PREBUILT: no CTest tree; the layouts test by hand, as CTest would run it (it needs mpirun)
  t=$(bounded "${CTEST_TIMEOUT:-120}")
  if ! command -v mpirun >/dev/null 2>&1; then
    skip device_layouts "no mpirun (none on this machine, none in the bundle: rebuild it with bench/gpu_bundle.sh)"
  elif [ "$t" -eq 0 ]; then
    skip device_layouts "time budget spent"
  else
    mkdir -p "$out/test-out"
    step device_layouts timeout "$t" env TRIDENT="$trident" PYTHON="$python" \
         TRIDENT_SOURCE_DIR="$src" TRIDENT_TEST_OUT="$out/test-out" TRIDENT_TEST_DEVICE=cuda \
         OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
         OMPI_MCA_rmaps_base_oversubscribe=1 "$python" "$src/test/mpi/device_layouts.py"
  fi
else
  skip ctest_cuda "no trident binary or no CUDA CTest tests"
fi

# One of the CUDA backend's script tests (test/unit/ops/cuda/emulate/, run on the stand-in by
# `make test-cuda-emu`) on the real GPU: emulate_script NAME BUDGET_S SCRIPT.
emulate_script() {
  local name=$1 budget=$2 script=$3 t
  t=$(bounded "$budget")
  if [ "$built" != yes ] || [ ! -x "$trident" ]; then
    skip "$name" "no trident binary"
  elif [ "$t" -eq 0 ]; then
    skip "$name" "time budget spent"
  else
    mkdir -p "$out/test-out"
    step "$name" timeout "$t" env TRIDENT="$trident" TRIDENT_SOURCE_DIR="$src" \
         TRIDENT_TEST_OUT="$out/test-out" OMPI_ALLOW_RUN_AS_ROOT=1 \
         OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
         "$python" "$src/test/unit/ops/cuda/emulate/$script"
  fi
}
# The per-op timing's own check (TRIDENT_OP_TIMING) with CUDA events: the table's counts and
# shares in a serial run (and at tp 2 where mpirun is).
emulate_script op_timing_test 60 op_timing.py
# The bf16 weight cache against no cache, bit for bit, over each way the weights change (the
# mpirun cases where mpirun is).
emulate_script weight_cache_test 90 weight_cache.py
# cuDNN attention in bf16 training: the fallback line (TRIDENT_CUDNN=0, a missing library) and,
# where cuDNN runs, its rows in the per-op table and losses within 1e-3 of trident's kernel.
emulate_script cudnn_fallback_test 60 cudnn_fallback.py
# runtime.cuda_graphs in training: GPT-2 and Llama, fp32 and bf16, dp 2: losses and weights
# with graphs equal eager ones bit for bit, and the graphs were launched.
emulate_script cuda_graphs_test 60 cuda_graphs.py

# The pipeline's idle time at pp = 4, m = 8 on this machine's CPU cores (CPU backend, one
# thread per rank: a core each, which a 2-core CI machine cannot give), this trident against
# PIPELINE_BEFORE (another trident binary, e.g. one from before receives were posted ahead of
# their actions): bench/pipeline_bench.py --pp 4 --compare. Needs mpirun; off unless set.
if [ -z "${PIPELINE_BEFORE:-}" ]; then
  skip pipeline_compare "PIPELINE_BEFORE not set"
elif ! command -v mpirun >/dev/null 2>&1 || [ ! -x "$trident" ]; then
  skip pipeline_compare "no mpirun or no trident binary"
else
  t=$(bounded "${PIPELINE_TIMEOUT:-120}")
  if [ "$t" -eq 0 ]; then
    skip pipeline_compare "time budget spent"
  else
    mkdir -p "$out/pipeline/before" "$out/pipeline/after"
    ln -sf "$(cd "$(dirname "$PIPELINE_BEFORE")" && pwd)/$(basename "$PIPELINE_BEFORE")" \
       "$out/pipeline/before/trident"
    ln -sf "$trident" "$out/pipeline/after/trident"
    step pipeline_compare timeout "$t" env PYTHON="$python" OMPI_ALLOW_RUN_AS_ROOT=1 \
         OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 \
         "$python" "$src/bench/pipeline_bench.py" --pp 4 --build "$out/pipeline/after" \
         --compare "$out/pipeline/before"
  fi
fi

# Out-of-bounds accesses and shared-memory races in trident's own kernels (the fp32 cases of
# everything but the pure cuBLAS products, and the bf16 linears: their bf16 packing, the bias
# gradient's column sums and the cuBLASLt bias epilogue; the tensor-core flash attention, bf16,
# on small shapes: hs 32, 64, 128, causal and full, ring blocks; the fused LM head's
# classifier, CudaOps.LmHead*), each bounded in time; and
# synccheck (barriers every thread of a block or warp must reach) over the tensor-core flash
# attention, whose warps share tiles through __syncthreads and __syncwarp. SANITIZE=0 leaves
# them out.
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
if [ "${SANITIZE:-1}" = 0 ]; then
  skip memcheck "SANITIZE=0"
  skip racecheck "SANITIZE=0"
  skip synccheck "SANITIZE=0"
elif [ "$built" != yes ] || [ ! -x "$tests" ]; then
  skip memcheck "not built"
  skip racecheck "not built"
  skip synccheck "not built"
elif [ ! -x "$sanitizer" ]; then
  skip memcheck "no compute-sanitizer"
  skip racecheck "no compute-sanitizer"
  skip synccheck "no compute-sanitizer"
else
  tc_flash='Fast/*flash_b2_t77_nh2_nkv2_hs32_bf16:Fast/*flash_b2_t130_nh4_nkv2_hs64_bf16'
  tc_flash+=':Fast/*flash_full_b1_t45_nh2_nkv2_hs128_bf16:Fast/*flash_blocks_b1_t75_nh4_nkv2_hs64_bf16'
  t=$(bounded "${MEMCHECK_TIMEOUT:-100}")
  if [ "$t" -eq 0 ]; then
    skip memcheck "time budget spent"
  else
    step memcheck timeout "$t" "$sanitizer" --tool memcheck --error-exitcode 99 \
         "$tests" --gtest_filter="Fp32/*:Fast/*linear_*_bf16:$tc_flash:CudaOps.LmHead*:CudaOps.AdamWSegments*:CudaFusedBlock.*-Fp32/*gemm_*:Fp32/*linear_*"
  fi
  t=$(bounded "${RACECHECK_TIMEOUT:-45}")
  if [ "$t" -eq 0 ]; then
    skip racecheck "time budget spent"
  else
    step racecheck timeout "$t" "$sanitizer" --tool racecheck --error-exitcode 99 \
         "$tests" --gtest_filter="Fp32/*layernorm*:Fp32/*xent*:Fp32/*sum_squares*:Fp32/*embedding*:$tc_flash:CudaOps.LmHead*:CudaFusedBlock.*"
  fi
  t=$(bounded "${SYNCCHECK_TIMEOUT:-30}")
  if [ "$t" -eq 0 ]; then
    skip synccheck "time budget spent"
  else
    step synccheck timeout "$t" "$sanitizer" --tool synccheck --error-exitcode 99 \
         "$tests" --gtest_filter="$tc_flash"
  fi
fi

# Issue 29's pp 4 run, started in the background after the build (pp4_start): its status.
if [ -n "$pp4_pid" ]; then
  rc=0
  wait "$pp4_pid" || rc=$?
  record pipeline_pp4 "$rc"
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
  echo
  echo "cuDNN attention: library ${cudnn_lib:-not looked for}; probe (cudnn_probe.log):"
  grep -E '^(----|ok   load|note|FAIL|ok   plan|ok   forward|ok   backward|ok   other)' \
      "$out/cudnn_probe.log" \
      2>/dev/null | sed -e 's/^/  /' || echo "  (no probe log)"
  grep -h "cuDNN attention unavailable" "$out"/op_tests.log "$out"/attention_bench.log \
      2>/dev/null | sort -u | sed -e 's/^/  fell back: /' || true
  if [ -s "$out/attention_bench.jsonl" ] || [ -s "$out/attention_torch.jsonl" ]; then
    echo "  causal bf16 attention, B 8 T 1024 NH 12 HS 64 (attention_bench.jsonl, attention_torch.jsonl):"
    cat "$out/attention_bench.jsonl" "$out/attention_torch.jsonl" 2>/dev/null | sed -n 's/.*"path": "\([^"]*\)", "used": \([a-z]*\).*"fwd_ms": \([0-9.]*\), "bwd_ms": \([0-9.]*\), "fwd_tflops": \([0-9.]*\), "bwd_tflops": \([0-9.]*\).*/\1 \2 \3 \4 \5 \6/p' |
        awk '{printf "  %-8s ran %-5s fwd %8s ms %7s TFLOP/s   bwd %8s ms %7s TFLOP/s\n", $1, $2, $3, $5, $4, $6}'
  fi
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
  if [ -s "$out/train_bench/gpu_train_bench.txt" ]; then
    echo
    cat "$out/train_bench/gpu_train_bench.txt"
  fi
  if [ -s "$out/graphs_bench/gpu_train_bench.txt" ]; then
    sed -n '/^runtime.cuda_graphs/,$p' "$out/graphs_bench/gpu_train_bench.txt"
  fi
  if [ -s "$out/env_probe.log" ]; then
    echo
    echo "Machine (bench/gpu_probe.py; env_probe.json):"
    sed -e 's/^/  /' "$out/env_probe.log"
  fi
  if [ -s "$out/torch_peer.log" ]; then
    echo
    grep -A8 '^PyTorch' "$out/torch_peer.log" || tail -n 5 "$out/torch_peer.log"
  fi
  if [ -s "$out/torch_peer.json" ] && [ -s "$out/train_bench/gpu_train_bench.json" ]; then
    echo
    "$python" - "$out/train_bench/gpu_train_bench.json" "$out/torch_peer.json" <<'PY' || true
import json, sys
ours = {r["model"]: r for r in json.load(open(sys.argv[1]))["results"] if "error" not in r}
peer = {r["model"]: r for r in json.load(open(sys.argv[2]))["results"] if "error" not in r}
print("trident vs PyTorch, same GPU, same model and step (issue 27: trident <= 0.8x PyTorch's step):")
for name in ours:
    if name in peer:
        a, b = ours[name]["median_step_s"], peer[name]["median_step_s"]
        print(f"  {name:<8} trident {1e3 * a:8.1f} ms ({100 * ours[name]['mfu_vs_peak']:.1f}% MFU)  "
              f"PyTorch {1e3 * b:8.1f} ms ({100 * peer[name]['mfu_vs_peak']:.1f}% MFU)  ratio {a / b:.2f}")
PY
  fi
  if [ -s "$out/op_table/op_table.txt" ]; then
    echo
    echo "Per-op GPU time of one steady step (bench/gpu_op_table.py; op_table/op_table.json):"
    cat "$out/op_table/op_table.txt"
  fi
  if [ -s "$out/op_table/op_table.json" ] && [ -s "$out/train_bench/gpu_train_bench.json" ]; then
    echo
    "$python" - "$out/op_table/op_table.json" "$out/train_bench/gpu_train_bench.json" <<'PY' || true
# The events time the ops only: what is left of the step's wall time is host work and the
# GPU waiting for it (launch overhead, synchronizations): what CUDA graphs would win back.
import json, sys
ops = json.load(open(sys.argv[1]))
steps = {r["model"]: r for r in json.load(open(sys.argv[2]))["results"] if "error" not in r}
print("GPU time inside ops / step wall time (op_table's events over train_bench's median step):")
shown = 0
for name, step in steps.items():
    now = ops.get(f"{name}/now")
    if now and step.get("median_step_s"):
        wall = 1e3 * step["median_step_s"]
        print(f"  {name:<8} {now['step_ms']:8.1f} of {wall:8.1f} ms ({100 * now['step_ms'] / wall:.1f}%; "
              f"the rest: launch gaps, host work, synchronizations)")
        shown += 1
if not shown:
    print("  none: no model has both an op table and a step time")
PY
  fi
  if [ -s "$out/lt_tune/op_table.json" ]; then
    echo
    "$python" - "$out/op_table/op_table.json" "$out/lt_tune/op_table.json" <<'PY' || true
import json, sys
try:
    now = json.load(open(sys.argv[1])).get("small/now")
except OSError:
    now = None
tuned = json.load(open(sys.argv[2])).get("small/now")
print("cuBLASLt algorithm choice (TRIDENT_CUDA_LT_TUNE=1; lt_tune/op_table.json), GPT-2 small, "
      "ms per steady step:")
if tuned and now:
    for g in sorted(set(now["groups"]) | set(tuned["groups"])):
        a = now["groups"].get(g, {"ms": 0.0})["ms"]
        b = tuned["groups"].get(g, {"ms": 0.0})["ms"]
        print(f"    {g:<12} {a:9.2f} -> {b:9.2f}")
    print(f"    {'total':<12} {now['step_ms']:9.2f} -> {tuned['step_ms']:9.2f}  (unset -> tuned)")
elif tuned:
    print(f"    tuned {tuned['step_ms']:.2f} (no untuned table from op_table)")
PY
    grep -h "cuBLASLt tuning" "$out/lt_tune.log" 2>/dev/null | sed -e 's/^/  /' || true
  fi
  if [ -s "$out/pipeline_pp4.log" ]; then
    echo
    echo "Issue 29 at pp 4 on the CPU cores (bench/pipeline_bench.py; pipeline_pp4.log):"
    sed -n '/pipeline bubbles:/,$p' "$out/pipeline_pp4.log" | grep -v '^results:' || true
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
  printf ',\n  "attention_bench": '
  cat "$out/attention_bench.jsonl" "$out/attention_torch.jsonl" 2>/dev/null >"$out/attention_all.jsonl" || true
  json_lines "$out/attention_all.jsonl"
  printf ',\n  "env_probe": '
  if [ -s "$out/env_probe.json" ]; then sed -e '2,$s/^/  /' "$out/env_probe.json"; else printf 'null'; fi
  printf ',\n  "torch_peer": '
  if [ -s "$out/torch_peer.json" ]; then sed -e '2,$s/^/  /' "$out/torch_peer.json"; else printf 'null'; fi
  printf ',\n  "op_table": '
  if [ -s "$out/op_table/op_table.json" ]; then sed -e '2,$s/^/  /' "$out/op_table/op_table.json"; else printf 'null'; fi
  printf ',\n  "lt_tune": '
  if [ -s "$out/lt_tune/op_table.json" ]; then sed -e '2,$s/^/  /' "$out/lt_tune/op_table.json"; else printf 'null'; fi
  printf ',\n  "train_bench": '
  if [ -s "$out/train_bench/gpu_train_bench.json" ]; then
    sed -e '2,$s/^/  /' "$out/train_bench/gpu_train_bench.json"
  else
    printf 'null'
  fi
  printf ',\n  "graphs_bench": '
  if [ -s "$out/graphs_bench/gpu_train_bench.json" ]; then
    sed -e '2,$s/^/  /' "$out/graphs_bench/gpu_train_bench.json"
  else
    printf 'null'
  fi
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
