import pytest

from mtrl_worker.environments.sandbox import network_isolated, run_tests

TESTS = [("f(2)", "4"), ("f(-1)", "1")]


async def test_passing_and_failing_tests_are_counted() -> None:
    result = await run_tests("def f(x):\n    return x * 2", TESTS)
    assert (result.passed, result.total, result.timed_out) == (1, 2, False)


async def test_expected_value_error() -> None:
    source = "def f(x):\n    raise ValueError(x)"
    assert (await run_tests(source, [("f(1)", "'!ValueError'")])).passed == 1


async def test_wall_clock_limit_kills_the_process_group() -> None:
    source = "import time\ndef f(x):\n    time.sleep(60)"
    result = await run_tests(source, TESTS, timeout_s=1)
    assert result.timed_out and result.passed == 0


async def test_memory_limit() -> None:
    result = await run_tests("blob = bytearray(1 << 31)\ndef f(x): return x*x", TESTS)
    assert result.passed == 0 and "MemoryError" in (result.error or "")


@pytest.mark.parametrize(
    "source",
    [
        "import socket\nsocket.socket()",
        "import subprocess\nsubprocess.run(['true'])",
        "import os\nos.system('true')",
    ],
)
async def test_network_and_processes_are_refused(source: str) -> None:
    result = await run_tests(source + "\ndef f(x): return x * x", TESTS)
    assert result.passed == 0 and "PermissionError" in (result.error or "")


async def test_network_namespace_when_available() -> None:
    if not network_isolated():
        pytest.skip("unshare --net is not permitted here; the audit hook is the only guard")
    # The audit hook guards the Python API; the namespace is the real boundary: it has no
    # interface but loopback, whatever the host has.
    source = (
        "import pathlib\n"
        "LINES = pathlib.Path('/proc/net/dev').read_text().splitlines()[2:]\n"
        "def f(x): return sorted(line.split(':')[0].strip() for line in LINES)"
    )
    result = await run_tests(source, [("f(0)", "['lo']")])
    assert result.passed == 1
