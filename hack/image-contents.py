"""What each image's Python layer holds, measured without a Docker engine.

For every images/<name>/Dockerfile: build the wheel from the source folders it copies, as its
wheel stage does, install it with the extra its final stage asks for into a fresh virtualenv,
and print the first-party packages, the distributions and their size on disk. The trainer
image's base already holds torch (and CUDA's wheels), so those are left out of its count.

    make image-contents                                   # this checkout
    .venv/bin/python hack/image-contents.py --source DIR  # another tree (e.g. a git worktree)
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE_IMAGE_HOLDS = re.compile(r"^(torch|triton|nvidia-.*|cuda-.*)$")  # the trainer's base image


def _dockerfile(source: Path, name: str) -> tuple[list[str], str]:
    """(source folders the wheel stage copies, the extra the final stage installs or "")."""
    text = (source / "images" / name / "Dockerfile").read_text()
    roots = [m for m in re.findall(r"^COPY (\w+) \1$", text, re.M)]
    extra = re.search(r"mtrl-\*\.whl\)?\"?(?:\[([\w,-]+)\])?", text)
    return roots, (extra.group(1) or "") if extra else ""


def _run(*argv: str | Path) -> str:
    return subprocess.run([str(a) for a in argv], check=True, capture_output=True,
                          text=True).stdout


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def measure(source: Path, name: str, work: Path) -> dict[str, object]:
    roots, extra = _dockerfile(source, name)
    src = work / "src"
    src.mkdir()
    for item in ("pyproject.toml", "README.md", *roots):
        (shutil.copytree if (source / item).is_dir() else shutil.copy)(
            source / item, src / item, **({"ignore": shutil.ignore_patterns(
                "__pycache__", "*.egg-info")} if (source / item).is_dir() else {}))
    _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", work / "dist", src)
    wheel = next((work / "dist").glob("mtrl-*.whl"))
    target = f"{wheel}[{extra}]" if extra else str(wheel)
    _run(sys.executable, "-m", "venv", "--without-pip", work / "venv")
    site = next((work / "venv").glob("lib/python*/site-packages"))
    empty = _size(site)
    report = work / "report.json"
    _run(sys.executable, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
         "--report", report, target)
    resolved = [(i["metadata"]["name"], i["metadata"]["version"])
                for i in json.loads(report.read_text())["install"]]
    left_out = sorted(n for n, _ in resolved if name == "trainer" and BASE_IMAGE_HOLDS.match(n))
    wanted = [f"{n}=={v}" for n, v in resolved if n not in left_out and n != "mtrl"]
    _run(sys.executable, "-m", "pip", "--python", work / "venv" / "bin" / "python", "install",
         "-q", "--no-deps", "--no-compile", str(wheel), *wanted)
    first_party = sorted(p.name for p in site.iterdir() if p.name.startswith("mtrl_"))
    return {"image": name, "extra": extra, "packages": first_party,
            "distributions": sorted(n for n, _ in resolved if n not in left_out),
            "left_out": left_out, "mib": round((_size(site) - empty) / 2**20, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", type=Path, default=REPO)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for name in ("operator", "worker", "trainer"):
        with tempfile.TemporaryDirectory(prefix=f"mtrl-image-{name}-") as tmp:
            rows.append(measure(args.source, name, Path(tmp)))
        row = rows[-1]
        print(f"{name:9} [{row['extra'] or '-'}] {row['mib']:7.1f} MiB  "
              f"{len(row['distributions']):3d} distributions  {' '.join(row['packages'])}")
        print(f"          {' '.join(row['distributions'])}")
        if row["left_out"]:
            print(f"          left out (the base image's): {' '.join(row['left_out'])}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
