"""The reference GRPO + LoRA trainer: generation service, rollout orchestration and updates."""
