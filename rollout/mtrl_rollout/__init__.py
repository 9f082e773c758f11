"""The rollout data plane shared by trainer and workers: messages, SQS transport, S3 offload and
reward-collapse statistics."""
