#!/usr/bin/env bash
# Step 2 (reward model), single_node deployment.
# Usage: run.sh [OUTPUT_DIR] [ZERO_STAGE] [MODEL] [more main.py flags...]
set -euo pipefail
STEP_DIR=$(cd "$(dirname "$0")/../.." && pwd)
source "$STEP_DIR/../launch.sh"
OUTPUT=${1:-./output/reward-models/tiny}
ZERO_STAGE=${2:-2}
MODEL=${3:-tiny}
shift $(( $# < 3 ? $# : 3 ))
launch single_node "$STEP_DIR/main.py" --model_name_or_path "$MODEL" --zero_stage "$ZERO_STAGE" --output_dir "$OUTPUT" "$@"
