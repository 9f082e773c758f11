"""The test bed's moto launcher answers the retention check as moto itself does, only cheaper."""

from __future__ import annotations

import pytest
from moto.sqs.models import SQSBackend

from mtrl_testbed import moto_main
from mtrl_testbed.moto import REGION

RETENTION_S = 60  # SQS's shortest MessageRetentionPeriod


def backend_with_messages() -> SQSBackend:
    backend = SQSBackend(REGION, "123456789012")
    backend.create_queue("q", MessageRetentionPeriod=str(RETENTION_S))
    backend.send_message("q", "fresh")
    expired = backend.send_message("q", "expired")
    expired.sent_timestamp -= (RETENTION_S + 1) * 1000  # type: ignore[operator]
    just_in = backend.send_message("q", "just in")
    just_in.sent_timestamp -= (RETENTION_S - 5) * 1000  # type: ignore[operator]
    return backend


def test_the_fast_check_agrees_with_moto_s_own() -> None:
    backend = backend_with_messages()
    messages = backend.get_queue("q")._messages
    own = [SQSBackend.is_message_valid_based_on_retention_period(backend, "q", m) for m in messages]
    fast = [moto_main.fast_retention_check(backend, "q", m) for m in messages]
    assert fast == own == [True, False, True]


def test_receive_with_the_patch_still_stops_at_an_expired_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's ReceiveMessage ends its pass at the first expired message; so does the patch."""
    unpatched = backend_with_messages()
    own = [m.body for m in unpatched.receive_message("q", 10, 0, 30)]
    monkeypatch.setattr(SQSBackend, "is_message_valid_based_on_retention_period",
                        SQSBackend.is_message_valid_based_on_retention_period)
    assert moto_main.patch()
    patched = backend_with_messages()
    fast = [m.body for m in patched.receive_message("q", 10, 0, 30)]
    assert fast == own == ["fresh"]


def test_moto_s_modules_are_listed_once_and_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import backends

    listed = list(backends.list_of_moto_modules())
    monkeypatch.setattr(backends, "list_of_moto_modules", backends.list_of_moto_modules)
    moto_main.read_modules_once()
    assert list(backends.list_of_moto_modules()) == listed
    assert "sqs" in listed and "ecs" in listed
    assert backends.list_of_moto_modules() is backends.list_of_moto_modules()
