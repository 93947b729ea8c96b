"""Email about errors and node changes (smtplib; off by default; never raises).

``Notifier(EmailConfig).send(subject, body)`` sends one plain-text message to ``to`` from
``sender`` through ``smtp_host:smtp_port`` (STARTTLS and login when configured; the password
is read from ``password_file`` at send time and never logged). A failure is logged as one
WARNING line and the manager goes on.
"""
from __future__ import annotations

import logging
import smtplib
import socket
import ssl
from email.message import EmailMessage
from typing import Any

log = logging.getLogger(__name__)

SMTP_TIMEOUT = 20.0


class Notifier:
    """Sends mail when ``config`` (an ``EmailConfig``) is enabled; else does nothing."""

    def __init__(self, config: Any = None) -> None:
        self.config = config
        self.sent = 0
        self.failed = 0

    @property
    def enabled(self) -> bool:
        return bool(self.config is not None and self.config.enabled and self.config.to)

    def send(self, subject: str, body: str) -> bool:
        """True when the message was handed to the SMTP server."""
        if not self.enabled:
            return False
        cfg = self.config
        msg = EmailMessage()
        msg["Subject"] = " ".join(subject.split())[:200]
        msg["From"] = cfg.sender
        msg["To"] = ", ".join(cfg.to)
        msg.set_content(body)
        try:
            with smtplib.SMTP(cfg.smtp_host, cfg.smtp_port, timeout=SMTP_TIMEOUT) as smtp:
                if cfg.starttls:
                    smtp.starttls(context=ssl.create_default_context())
                if cfg.username:
                    password = ""
                    if cfg.password_file is not None:
                        password = cfg.password_file.read_text().strip()
                    smtp.login(cfg.username, password)
                smtp.send_message(msg)
        except (OSError, smtplib.SMTPException, socket.timeout, ssl.SSLError) as err:
            self.failed += 1
            log.warning("cannot send email %r to %s via %s:%s: %s", msg["Subject"],
                        msg["To"], cfg.smtp_host, cfg.smtp_port,
                        " ".join(str(err).split()) or type(err).__name__)
            return False
        self.sent += 1
        return True
