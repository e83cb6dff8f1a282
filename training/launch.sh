# How a step is launched, in one place: every training_scripts/<deployment>/run.sh runs
#
#   bash training/launch.sh <deployment> <main.py> [main.py flags...]
#
# (sourced, it defines the function `launch <deployment> <main.py> [main.py flags...]`)
#
# single_gpu  one process (one GPU; on a CPU-only machine, one CPU process)
# single_node every GPU of this machine (NUM_GPUS to choose; on a CPU-only machine, 2 processes over gloo)
# multi_node  the hosts of $HOSTFILE (default /job/hostfile), every GPU of each
#
# OMP_NUM_THREADS (the idle CPUs this launch may use / processes) and OMP_WAIT_POLICY=PASSIVE are exported unless
# already set: `python -m utils.runtime.threads` decides, as the python entry points do when started by hand.
# PYTHON names the interpreter of the thread probe (default: `python` on PATH); train.py sets it to its own, the one
# whose bin/ (and `deepspeed` launcher) it puts first on PATH.
# MASTER_PORT picks the rendezvous port (default: one the kernel has free now, so runs can share a machine).
# DRY_RUN=1 prints the launcher command instead of running it.

has_cuda() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

launch() {
    local deployment=$1; shift
    local procs launcher_args
    case "$deployment" in
        single_gpu) procs=1; launcher_args=(--num_gpus 1) ;;
        single_node)
            if [ -n "${NUM_GPUS:-}" ]; then procs=$NUM_GPUS
            elif has_cuda; then procs=$(nvidia-smi -L | wc -l)
            else procs=2; fi
            launcher_args=(--num_gpus "$procs") ;;
        multi_node)
            local hostfile=${HOSTFILE:-/job/hostfile}
            if [ -z "${DRY_RUN:-}" ] && [ ! -f "$hostfile" ]; then
                echo "error: multi_node needs a hostfile: $hostfile does not exist (set HOSTFILE)" >&2; return 2
            fi
            procs=${NUM_GPUS:-1}
            launcher_args=(--hostfile "$hostfile") ;;
        *) echo "error: unknown deployment type '$deployment' (single_gpu, single_node, multi_node)" >&2; return 2 ;;
    esac
    local root; root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local exports; exports=$(PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python}" -m utils.runtime.threads --processes "$procs")
    eval "$exports"
    local omp="" name
    for name in OMP_NUM_THREADS OMP_WAIT_POLICY GOMP_SPINCOUNT; do
        if [ -n "${!name:-}" ]; then omp+="$name=${!name} "; fi
    done
    local port=${MASTER_PORT:-$("${PYTHON:-python}" -c \
        'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')}
    local main=$1; shift
    if [ -f "$main" ]; then main="$(cd "$(dirname "$main")" && pwd)/$(basename "$main")"; fi  # run.sh's ../../main.py
    local cmd=(deepspeed "${launcher_args[@]}" --master_port "$port" "$main" "$@")
    if [ -n "${DRY_RUN:-}" ]; then
        echo "$omp${cmd[*]}"
    else
        echo "launching: $omp${cmd[*]}"
        "${cmd[@]}"
    fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then  # run, not sourced
    set -euo pipefail
    launch "$@"
fi
