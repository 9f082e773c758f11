"""`make bench`: run every benchmark here and rewrite BENCHMARKS.md with their tables.

Each benchmark is its own process and prints markdown tables (and `> ` notes); this script
records the exact command, the date and the machine next to each. GPU-only figures (the trainer
on an H200) come from `bench/gpu_check.sh` on the GPU machine; here it runs its tiny CPU dry run
(with TRL's side when `make bench-wheels-cpu` has been run).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PY = ".venv/bin/python"
BENCHES = [
    ("Operator overhead (P1-P3)",
     [PY, "bench/operator_bench.py", "--runs", "20"]),
    ("Scale: one operator, many concurrent runs (P4)",
     [PY, "bench/scale_bench.py", "--runs", "10", "100", "500", "1000"]),
    ("Scale: what one run's status write costs the API server (issue 25)",
     [PY, "bench/status_write_bench.py", "--writes", "400", "--rounds", "2"]),
    ("Failover: the chart's two replicas, the leader killed (issue 12)",
     [PY, "bench/failover_bench.py", "--kills", "3"]),
    ("Transport (P5)",
     [PY, "bench/transport_bench.py", "--messages", "1000", "--concurrency", "4", "--turns", "100"]),
    ("Trainer: serving multi-turn episodes (issue 14)",
     [PY, "bench/serving_bench.py"]),
    ("Trainer: training memory at long context (issue 14)",
     [PY, "bench/memory_bench.py"]),
    ("Trainer: GPT-OSS-20B shapes on CPU (issue 14)",
     [PY, "bench/gpt_oss_cpu.py"]),
    ("Trainer: asynchronous GRPO, synchronous vs maxStepsOffPolicy 1 and 2 (issue 15)",
     [PY, "bench/async_bench.py"]),
    ("Trainer: where a `guess` step's time goes on CPU, setting by setting (issue 42)",
     [PY, "bench/step_speed.py", "--repeats", "2"]),
    ("Learning: SmolLM2-135M-Instruct plays `guess`, held-out success before and after (issue 22)",
     [PY, "bench/learning_bench.py"]),
    ("Trainer: GPU readiness check, CPU dry run (P6 needs a GPU: see below)",
     ["bash", "bench/gpu_check.sh", "--tiny"]),
]


def _tables(stdout: str) -> str:
    """The markdown tables (and TRL's note) a benchmark printed, a blank line before each new
    table (a header row is the one followed by a `|---` row) so they do not run together."""
    lines = [line for line in stdout.splitlines() if line.startswith(("|", "TRL", "> "))]
    out: list[str] = []
    for i, line in enumerate(lines):
        starts_table = i + 1 < len(lines) and lines[i + 1].startswith("|---")
        if out and (starts_table or not line.startswith("|")):
            out.append("")
        out.append(line)
    return "\n".join(out)


def _sections(text: str) -> dict[str, str]:
    """BENCHMARKS.md's sections by title: what `--only` keeps of the last full run."""
    parts = text.split("\n## ")
    return {part.split("\n", 1)[0]: f"## {part.rstrip()}\n" for part in parts[1:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], metavar="TEXT",
                        help="run only the benchmarks whose title contains TEXT (repeatable) "
                             "and keep the other sections of BENCHMARKS.md as they are")
    args_ = parser.parse_args(argv)
    previous = _sections((REPO / "BENCHMARKS.md").read_text()) \
        if args_.only and (REPO / "BENCHMARKS.md").exists() else {}
    sections = []
    failed = 0
    wheels = REPO / "bench" / "wheels-cpu"
    for title, args in BENCHES:
        if args_.only and not any(text in title for text in args_.only):
            if title in previous:
                sections.append(previous[title])
            continue
        cmd = [sys.executable if a == PY else a for a in args]
        print(f"== {title}: {' '.join(args)}", flush=True)
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO), "PYTHON": sys.executable,
                                   "MTRL_WHEELS": str(wheels)})
        table = _tables(proc.stdout)
        if proc.returncode != 0:
            failed += 1
            table += f"\n\nFAILED (exit {proc.returncode}):\n```\n{proc.stderr[-2000:]}\n```"
        print(table, flush=True)
        sections.append(f"## {title}\n\n`{' '.join(args)}`\n\n{table}\n")
    written = "Sections rewritten by `make bench` (`bench/run_all.py --only`)" if args_.only \
        else "Written by `make bench`"
    header = (f"# Benchmarks\n\n{written} on {dt.date.today()} "
              f"({platform.machine()}, {os.cpu_count()} cores). Figures are measured side by "
              "side in one run; the machine is shared and noisy, so read ratios, not "
              "absolutes.\n\n")
    body = header + "\n".join(sections)
    # Measured by hand (images: `hack/build-images.sh`), the soak's last result (`make soak`),
    # notes.
    for extra in ("IMAGES.md", "SOAK.md", "NOTES.md"):
        path = REPO / "bench" / extra
        if path.exists():
            body += "\n" + path.read_text()
    (REPO / "BENCHMARKS.md").write_text(body)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
