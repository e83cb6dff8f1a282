#!/usr/bin/env bash
# Step 3 (RL), multi_node deployment (the hosts of $HOSTFILE); every flag goes to main.py (training/launch.sh):
#   bash run.sh --actor_model_name_or_path ACTOR --critic_model_name_or_path REWARD_MODEL
#     --actor_zero_stage N --critic_zero_stage N --output_dir OUT [more main.py flags...]
exec bash "$(dirname "$0")/../../../launch.sh" multi_node "$(dirname "$0")/../../main.py" "$@"
