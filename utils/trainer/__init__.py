"""The training layer: the shared loop, engine set-up, checkpoints, frozen models, the RL trainer and the report.

Above utils/data, utils/rl, utils/model and inference/; below the steps in training/."""
