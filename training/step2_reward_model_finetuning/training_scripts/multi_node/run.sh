#!/usr/bin/env bash
# Step 2 (reward model), multi_node deployment (the hosts of $HOSTFILE); every flag goes to main.py (training/launch.sh):
#   bash run.sh --model_name_or_path MODEL --zero_stage N --output_dir OUT [more main.py flags...]
exec bash "$(dirname "$0")/../../../launch.sh" multi_node "$(dirname "$0")/../../main.py" "$@"
