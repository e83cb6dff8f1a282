#!/usr/bin/env bash
# Step 2 (DPO), multi_node deployment.
# Usage: run.sh [OUTPUT_DIR] [ZERO_STAGE] [STEP1_ACTOR] [more main.py flags...]
set -euo pipefail
STEP_DIR=$(cd "$(dirname "$0")/../.." && pwd)
source "$STEP_DIR/../launch.sh"
OUTPUT=${1:-./output/dpo-models/tiny}
ZERO_STAGE=${2:-2}
ACTOR=${3:-./output/actor-models/tiny}
shift $(( $# < 3 ? $# : 3 ))
launch multi_node "$STEP_DIR/main.py" --model_name_or_path "$ACTOR" --zero_stage "$ZERO_STAGE" --output_dir "$OUTPUT" "$@"
