#!/usr/bin/env bash
# Step 2 (reward model), single_gpu deployment (one process); every flag goes to main.py (training/launch.sh):
#   bash run.sh --model_name_or_path MODEL --zero_stage N --output_dir OUT [more main.py flags...]
exec bash "$(dirname "$0")/../../../launch.sh" single_gpu "$(dirname "$0")/../../main.py" "$@"
