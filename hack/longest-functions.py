"""The project's longest functions, from the def line to the last line (code review's yardstick).

    python3 hack/longest-functions.py [N]     # the N longest (default 10)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("api", "operator", "cli", "rollout", "worker", "trainer", "testbed")


def lengths() -> list[tuple[int, str]]:
    rows = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    rows.append((node.end_lineno - node.lineno + 1,
                                 f"{path.relative_to(REPO)}:{node.lineno} {node.name}"))
    return sorted(rows, reverse=True)


if __name__ == "__main__":
    for length, where in lengths()[: int(sys.argv[1]) if len(sys.argv) > 1 else 10]:
        print(f"{length:4d}  {where}")
