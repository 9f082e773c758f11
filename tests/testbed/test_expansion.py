"""The node agent expands $(NAME) in commands and env values as the kubelet does (the Go cases
are kubernetes third_party/forked/golang/expansion/expand_test.go's)."""

from __future__ import annotations

import pytest

from mtrl_testbed.node_agent import expand

ENV = {"VAR_A": "A", "VAR_B": "B", "VAR_EMPTY": "", "PET_NODE_RANK": "1"}


@pytest.mark.parametrize(("given", "expected"), [
    ("$(VAR_A)", "A"),
    ("___$(VAR_B)___", "___B___"),
    ("$(VAR_A)-$(VAR_B)", "A-B"),
    ("$(VAR_EMPTY)", ""),
    ("$(UNDEFINED)", "$(UNDEFINED)"),  # left as written
    ("$$(VAR_A)", "$(VAR_A)"),  # escaped
    ("$$$(VAR_A)", "$A"),
    ("$VAR_A", "$VAR_A"),  # shell syntax is not the kubelet's
    ("$(VAR_A", "$(VAR_A"),  # unterminated
    ("price: 3$", "price: 3$"),
    ("--node-rank=$(PET_NODE_RANK)", "--node-rank=1"),
])
def test_expansion_follows_the_kubelet(given: str, expected: str) -> None:
    assert expand(given, ENV) == expected
