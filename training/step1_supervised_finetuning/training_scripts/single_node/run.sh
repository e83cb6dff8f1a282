#!/usr/bin/env bash
# Step 1 (SFT), single_node deployment (every GPU of this machine); every flag goes to main.py (training/launch.sh):
#   bash run.sh --model_name_or_path MODEL --zero_stage N --output_dir OUT [more main.py flags...]
exec bash "$(dirname "$0")/../../../launch.sh" single_node "$(dirname "$0")/../../main.py" "$@"
