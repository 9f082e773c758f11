"""Rollout worker: plays episodes of an environment against the trainer's policy."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """`mtrl worker`: imported lazily so environments load without the worker's server stack."""
    from mtrl_worker.cli import main as worker_main

    return worker_main(argv)


def play_main(argv: list[str] | None = None) -> int:
    """`mtrl env play`: one scripted episode, printed as a summary (or `--json`, its result)."""
    from mtrl_worker.play import play_main as run_play

    return run_play(argv)


__all__ = ["main", "play_main"]
