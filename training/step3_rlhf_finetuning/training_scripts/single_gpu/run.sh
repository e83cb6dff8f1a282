#!/usr/bin/env bash
# Step 3 (RL), single_gpu deployment (one process); every flag goes to main.py (training/launch.sh):
#   bash run.sh --actor_model_name_or_path ACTOR --critic_model_name_or_path REWARD_MODEL
#     --actor_zero_stage N --critic_zero_stage N --output_dir OUT [more main.py flags...]
exec bash "$(dirname "$0")/../../../launch.sh" single_gpu "$(dirname "$0")/../../main.py" "$@"
