"""Rollout worker: plays episodes of an environment against the trainer's policy.

`mtrl worker` runs `mtrl_worker.cli`; the environments (`mtrl_worker.environments`) load
without the worker's server stack, so the trainer can make their tasks.
"""
