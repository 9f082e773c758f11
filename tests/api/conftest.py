"""API tests check what the API server accepts; no operator may act on their runs, whatever
order the test files run in (the shared operator watches `t-*`)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from mtrl_testbed.cluster import LocalCluster


@pytest.fixture
def namespace(cluster: LocalCluster) -> Iterator[str]:
    with cluster.namespace(f"api-{uuid.uuid4().hex[:8]}") as name:
        yield name
