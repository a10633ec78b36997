#!/bin/bash
# The hand-written baseline of bench/requeue.py: requeue before the time limit the way
# one writes it without a launcher (signal to the batch shell, trap, srun in the
# background, scontrol requeue). bench/requeue.py submits it as
#   sbatch -N 2 --ntasks-per-node=1 -t 1 --signal=B:USR2@25 -o LOG \
#       requeue_handwritten.sh EVENTS PYTHON requeue_prog.py OUT_DIR
# The attempt is Slurm's SLURM_RESTART_COUNT (unset on the first attempt).
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --signal=B:USR2@25

# Benchmark stamps only (bash builtins, as hpclaunch's events.jsonl), not the pattern.
EVENTS=$1
shift
stamp() { printf '%s %s %s\n' "$1" "${SLURM_RESTART_COUNT:-0}" "${EPOCHREALTIME/,/.}" >>"$EVENTS"; }
stamp start

signalled=0
on_usr2() {
    signalled=1
    stamp signal
    kill -USR2 "$pid"  # srun forwards it to every task
}
trap on_usr2 USR2

srun "$@" &
pid=$!
wait "$pid"
rc=$?
# A trapped signal ends `wait` early (status > 128) while srun goes on.
while ((rc > 128)) && kill -0 "$pid" 2>/dev/null; do
    wait "$pid"
    rc=$?
done

if ((signalled)); then
    stamp requeue
    scontrol requeue "$SLURM_JOB_ID"
fi
exit "$rc"
