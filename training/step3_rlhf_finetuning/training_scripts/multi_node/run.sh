#!/usr/bin/env bash
# Step 3 (PPO), multi_node deployment.
# Usage: run.sh ACTOR_PATH CRITIC_PATH|"" [ACTOR_ZERO_STAGE] [CRITIC_ZERO_STAGE] [OUTPUT_DIR] [more main.py flags...]
set -euo pipefail
STEP_DIR=$(cd "$(dirname "$0")/../.." && pwd)
source "$STEP_DIR/../launch.sh"
ACTOR=${1:?actor model path (step 1 output)}
CRITIC=${2?critic/reward model path (step 2 output), or "" for critic-free RL on a reward function}
ACTOR_ZERO_STAGE=${3:-2}
CRITIC_ZERO_STAGE=${4:-2}
OUTPUT=${5:-./output/step3-models/tiny}
shift $(( $# < 5 ? $# : 5 ))
launch multi_node "$STEP_DIR/main.py" --actor_model_name_or_path "$ACTOR" ${CRITIC:+--critic_model_name_or_path "$CRITIC"} \
    --actor_zero_stage "$ACTOR_ZERO_STAGE" --critic_zero_stage "$CRITIC_ZERO_STAGE" --output_dir "$OUTPUT" "$@"
