#!/usr/bin/env bash
# trident on a workstation: mpirun -np NP trident train DECK, with a graceful Ctrl-C.
#
#   jobscripts/local/run.sh [DECK] [more trident train arguments...]
#   NP=4 THREADS=2 jobscripts/local/run.sh input/default.toml --set train.steps=1000
#   NP=2 DEVICE=cuda jobscripts/local/run.sh big.toml            # one rank per GPU
#
# Ctrl-C (or SIGTERM, or SIGUSR1) asks trident to stop: every rank finishes the step it is
# in, writes a checkpoint of it and exits 0; run the same command again to continue
# (io.resume = "auto" resumes the same loss curve). A second Ctrl-C stops mpirun at once.
# (mpirun runs in its own session: Open MPI takes a SIGINT or SIGTERM of its own as an
# abort, so the script turns them into a SIGUSR1, which mpirun forwards to every rank.)
set -euo pipefail

# ---- settings: from the environment ---------------------------------------------------
NP=${NP:-1}                                 # MPI ranks
THREADS=${THREADS:-0}                       # threads per rank (0: cores / NP)
DEVICE=${DEVICE:-cpu}                       # cpu | cuda (then rank i uses GPU i % NGPUS)
NGPUS=${NGPUS:-}                            # GPUs to use (empty: nvidia-smi -L)
MPIRUN=${MPIRUN:-mpirun}
MPIRUN_ARGS=${MPIRUN_ARGS:---bind-to none}  # e.g. "--map-by slot:PE=4 --bind-to core"
if [[ -z ${TRIDENT:-} ]]; then              # the binary: ./build/trident, else on PATH
  if [[ -x build/trident ]]; then TRIDENT=build/trident; else TRIDENT=trident; fi
fi

deck=${1:-input/default.toml}
(( $# )) && shift
if [[ ! -f $deck ]]; then
  echo "run.sh: deck '$deck' not found (usage: jobscripts/local/run.sh [DECK] [ARGS...])" >&2
  exit 2
fi
if (( THREADS <= 0 )); then
  THREADS=$(( $(nproc) / NP ))
  (( THREADS >= 1 )) || THREADS=1
fi
export OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS
if [[ $(id -u) -eq 0 ]]; then               # Open MPI refuses root unless told
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi

cmd=("$TRIDENT" train "$deck" --set runtime.threads="$THREADS")
if [[ $DEVICE == cuda ]]; then
  [[ -n $NGPUS ]] || NGPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
  (( NGPUS >= 1 )) || { echo "run.sh: DEVICE=cuda but no GPU found (set NGPUS)" >&2; exit 2; }
  export NGPUS
  # Each rank sees one GPU: its node-local rank modulo NGPUS.
  # shellcheck disable=SC2016  # expanded by the rank's shell, not this one
  cmd=(bash -c 'export CUDA_VISIBLE_DEVICES=$(( ${OMPI_COMM_WORLD_LOCAL_RANK:-${MPI_LOCALRANKID:-0}} % NGPUS )); exec "$@"'
       gpu-bind "${cmd[@]}" --set runtime.device=cuda)
fi

echo "run.sh: $NP rank(s) x $THREADS thread(s), deck $deck (Ctrl-C: checkpoint and stop)"
# shellcheck disable=SC2086  # MPIRUN_ARGS is a list of arguments
setsid "$MPIRUN" -np "$NP" $MPIRUN_ARGS "${cmd[@]}" "$@" &
child=$!
stops=0
# shellcheck disable=SC2317  # called by the trap
on_stop() {
  stops=$(( stops + 1 ))
  if (( stops == 1 )); then
    echo "run.sh: stopping after this step (checkpoint); Ctrl-C again to abort" >&2
    kill -USR1 "$child" 2>/dev/null || true
  else
    kill -TERM "$child" 2>/dev/null || true
  fi
}
trap on_stop INT TERM USR1
while :; do
  rc=0
  wait "$child" || rc=$?
  if (( rc > 128 )) && kill -0 "$child" 2>/dev/null; then continue; fi
  break
done
exit "$rc"
