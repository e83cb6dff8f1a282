"""Shared machinery of the chatrlhf pipeline: data, models, LoRA, DeepSpeed set-up, saving, logging."""
