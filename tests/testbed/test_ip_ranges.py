"""Two node agents on one machine never hand out the same pod IP."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mtrl_testbed import node_agent


def test_each_agent_holds_its_own_loopback_range(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_agent, "IP_RANGE_LOCKS", tmp_path)
    first, first_lock = node_agent.claim_ip_range()
    second, second_lock = node_agent.claim_ip_range()
    assert first != second
    assert next(node_agent.ip_pool(first)) != next(node_agent.ip_pool(second))
    os.close(first_lock)  # the first agent exits: its range is free again
    again, again_lock = node_agent.claim_ip_range()
    assert again == first
    os.close(second_lock)
    os.close(again_lock)
