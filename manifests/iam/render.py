"""Render an IAM policy template: replace `${Name}` placeholders with values.

    python manifests/iam/render.py manifests/iam/operator-policy.json \
        Region=us-west-2 Account=111122223333 EcsCluster=default \
        WorkerTaskRoleArn=arn:aws:iam::111122223333:role/mtrl-worker \
        WorkerExecutionRoleArn=arn:aws:iam::111122223333:role/mtrl-worker-execution

A statement whose Sid starts with `Optional` is dropped when one of its placeholders has no
value (e.g. `OptionalQueueKms` without `QueueKmsKeyArn`); any other missing value is an error,
so a half-rendered policy never reaches IAM. IAM's own policy variables (`${aws:username}`)
contain a colon and are left alone.
"""

from __future__ import annotations

import json
import re
import sys
from typing import Any

PLACEHOLDER = re.compile(r"\$\{([A-Za-z][A-Za-z0-9]*)\}")
OPTIONAL_SID_PREFIX = "Optional"


class MissingValues(ValueError):
    pass


def placeholders(text: str) -> set[str]:
    return set(PLACEHOLDER.findall(text))


def _substitute(node: Any, values: dict[str, str]) -> Any:
    """Replace placeholders in every string of a JSON value (not in its encoding, so a value
    with quotes or backslashes cannot break the document)."""
    if isinstance(node, str):
        return PLACEHOLDER.sub(lambda m: values[m.group(1)], node)
    if isinstance(node, list):
        return [_substitute(v, values) for v in node]
    if isinstance(node, dict):
        return {k: _substitute(v, values) for k, v in node.items()}
    return node


def render(template: str, values: dict[str, str]) -> dict[str, Any]:
    """The policy document with every placeholder replaced."""
    document = json.loads(template)
    kept = []
    for statement in document["Statement"]:
        missing = placeholders(json.dumps(statement)) - values.keys()
        if missing and statement.get("Sid", "").startswith(OPTIONAL_SID_PREFIX):
            continue
        if missing:
            raise MissingValues(f"statement {statement.get('Sid', '?')}: no value for "
                                f"{', '.join(sorted(missing))}")
        kept.append(_substitute(statement, values))
    return {**document, "Statement": kept}


def main(argv: list[str]) -> int:
    if not argv or any("=" not in a for a in argv[1:]):
        print(__doc__, file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        template = f.read()
    values = dict(a.split("=", 1) for a in argv[1:])
    try:
        print(json.dumps(render(template, values), indent=2))
    except MissingValues as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
