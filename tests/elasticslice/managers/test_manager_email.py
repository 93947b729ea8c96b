"""Email about errors and node changes, against a real SMTP server (aiosmtpd) on 127.0.0.1."""
from __future__ import annotations

from collections.abc import Iterator
from email import message_from_bytes
from email.message import Message
from typing import Any

import pytest
from aiosmtpd.controller import Controller

from elasticslice.managers import Notifier
from elasticslice.managers.config import EmailConfig
from tests.helpers import spare_port


def free_port() -> int:
    return spare_port()


class Inbox:
    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
        self.messages.append(message_from_bytes(envelope.content))
        return "250 OK"

    def subjects(self) -> list[str]:
        return [str(m["Subject"]) for m in self.messages]


@pytest.fixture
def smtp() -> Iterator[tuple[Inbox, int]]:
    inbox = Inbox()
    port = free_port()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield inbox, port
    finally:
        controller.stop()


def email_config(port: int, **changes: Any) -> EmailConfig:
    return EmailConfig(**{"enabled": True, "to": ("me@example.org",), "smtp_port": port,
                          **changes})


def test_email_is_off_by_default(smtp) -> None:
    inbox, _ = smtp
    assert Notifier(EmailConfig()).send("hello", "body") is False
    assert Notifier(None).send("hello", "body") is False
    assert inbox.messages == []


def test_a_message_reaches_the_smtp_server(smtp) -> None:
    inbox, port = smtp
    notifier = Notifier(email_config(port, sender="manager@example.org"))
    assert notifier.send("node node-2 ready", "node-2 (ms1002) is ready") is True
    (msg,) = inbox.messages
    assert msg["Subject"] == "node node-2 ready"
    assert msg["To"] == "me@example.org" and msg["From"] == "manager@example.org"
    assert "ms1002" in msg.get_payload()


def test_an_unreachable_smtp_server_is_one_warning_not_an_exception(caplog) -> None:
    notifier = Notifier(email_config(free_port()))
    assert notifier.send("subject", "body") is False
    assert notifier.failed == 1
    warnings = [r for r in caplog.records if r.name == "elasticslice.managers.notify"]
    assert len(warnings) == 1 and "cannot send email" in warnings[0].getMessage()


def test_the_manager_emails_node_changes_and_errors(smtp, emulator, make_manager) -> None:
    inbox, port = smtp
    manager = make_manager(emulator, maxthreshold=3, email=Notifier(email_config(port)))
    manager.manage_once()
    subjects = inbox.subjects()
    assert "[elasticslice] slice created" in subjects
    assert "[elasticslice] added 2 node(s)" in subjects
    emulator.server.stop()  # CloudLab goes away: every CM method fails
    manager.manage_once()
    failures = [s for s in inbox.subjects() if s.endswith(" failed")]
    assert "[elasticslice] update_sliver_status failed" in failures
    body = next(m for m in inbox.messages if m["Subject"].endswith("update_sliver_status failed"))
    assert "1 in a row" in body.get_payload()
