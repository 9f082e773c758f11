"""Checkpoints in S3: written whole, then committed by a marker, so a kill at any point leaves
the previous checkpoint intact and never a half one that looks complete.

Layout under the run's own folder, <spec.output.s3Uri>/<namespace>/<name>/<uid> (runs given
the same prefix never see each other's checkpoints; spec.output.resumeFrom names others'):
    checkpoints/step-000010/adapter/adapter_model.safetensors   peft format
    checkpoints/step-000010/adapter/adapter_config.json
    checkpoints/step-000010/trainer_state.pt   step, optimizer, RNG states, step history
    checkpoints/step-000010/COMPLETE           written last: the commit point
    adapter/...                                the newest adapter, for serving
"""

from __future__ import annotations

import io
import logging
import random
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from peft import PeftModel
from peft.utils import set_peft_model_state_dict
from safetensors.torch import load

from mtrl_trainer import s3

log = logging.getLogger(__name__)

_STEP_DIR = re.compile(r"checkpoints/step-(\d{6,})/COMPLETE$")
_COMMITTED = re.compile(r"^(.*?)/?checkpoints/step-(\d{6,})/COMPLETE$")


@dataclass
class CheckpointState:
    """What a checkpoint keeps besides the adapter's weights (stored as a plain dict)."""

    step: int = 0
    optimizer: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)  # one entry per finished step
    # Steps of this run whose update trained the adapter (a checkpoint written before this
    # field existed counts its history's updated steps).
    trained_steps: int = -1

    def __post_init__(self) -> None:
        if self.trained_steps < 0:
            self.trained_steps = sum(bool(h.get("updated")) for h in self.history)


def capture_rng() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


class CheckpointStore:
    def __init__(self, output_uri: str, keep: int, client: Any | None = None) -> None:
        self.bucket, self.prefix = s3.parse_s3_uri(output_uri)
        self.keep = keep
        self._s3 = client or s3.client()

    def _key(self, *parts: str) -> str:
        return s3.join(self.prefix, *parts)

    def committed_steps(self) -> list[int]:
        keys = s3.list_keys(self._s3, self.bucket, self._key("checkpoints") + "/")
        steps = []
        for key in keys:
            match = _STEP_DIR.search(key)
            if match:
                steps.append(int(match.group(1)))
        return sorted(steps)

    def save(self, model: PeftModel, state: CheckpointState) -> None:
        step_dir = f"checkpoints/step-{state.step:06d}"
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp)
            for path in sorted(Path(tmp).rglob("*")):
                if path.is_file():
                    name = path.relative_to(tmp).as_posix()
                    for where in (f"{step_dir}/adapter", "adapter"):
                        self._s3.upload_file(str(path), self.bucket, self._key(where, name))
        buffer = io.BytesIO()
        torch.save(state.__dict__, buffer)
        self._put(f"{step_dir}/trainer_state.pt", buffer.getvalue())
        self._put(f"{step_dir}/COMPLETE", str(state.step).encode())
        log.info("checkpoint step %d written to s3://%s/%s", state.step, self.bucket,
                 self._key(step_dir))
        self._prune()

    def load_latest(self, model: PeftModel) -> CheckpointState | None:
        """Load the newest committed checkpoint into `model`; None when there is none."""
        steps = self.committed_steps()
        if not steps:
            return None
        step_dir = f"checkpoints/step-{steps[-1]:06d}"
        adapter_key = self._key(step_dir, "adapter", "adapter_model.safetensors")
        weights = load(self._get(adapter_key))
        result = set_peft_model_state_dict(model, weights)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"checkpoint {step_dir} does not fit the model: {unexpected[:3]}")
        # Our own bucket wrote it; the state holds Python RNG tuples, not only tensors.
        raw = torch.load(io.BytesIO(self._get(self._key(step_dir, "trainer_state.pt"))),
                         weights_only=False)
        return CheckpointState(**raw)

    def _prune(self) -> None:
        steps = self.committed_steps()
        for step in steps[: max(0, len(steps) - self.keep)]:
            step_dir = self._key(f"checkpoints/step-{step:06d}")
            # The marker goes first, so a kill mid-delete leaves an uncommitted leftover only.
            self._s3.delete_object(Bucket=self.bucket, Key=f"{step_dir}/COMPLETE")
            for key in s3.list_keys(self._s3, self.bucket, step_dir + "/"):
                self._s3.delete_object(Bucket=self.bucket, Key=key)

    def _put(self, name: str, data: bytes) -> None:
        self._s3.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)

    def _get(self, key: str) -> bytes:
        return bytes(self._s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())


def highest_checkpoint(uri: str, client: Any | None = None) -> tuple[str, int] | None:
    """(output URI, step) of the committed checkpoint with the highest step anywhere under the
    s3:// prefix `uri` (one run's folder, or a folder above several runs'), or None."""
    bucket, prefix = s3.parse_s3_uri(uri)
    found: list[tuple[int, str]] = []
    for key in s3.list_keys(client or s3.client(), bucket, f"{prefix}/" if prefix else ""):
        match = _COMMITTED.match(key)
        if match:
            found.append((int(match.group(2)), match.group(1)))
    if not found:
        return None
    step, root = max(found)
    return f"s3://{bucket}/{root}".rstrip("/"), step

