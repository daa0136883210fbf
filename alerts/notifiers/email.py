"""E-mail over SMTP (optionally STARTTLS and login). A 5xx SMTP reply (recipient refused,
authentication failed) is permanent; 4xx replies, timeouts and refused connections are
retried. The mail server's address is checked as a webhook's is (``targets``); the server's
reply text is not recorded, only its code. The ``Message-ID`` is the message's idempotency key,
the same when a message is sent again."""

from __future__ import annotations

import smtplib
import socket
from collections.abc import Sequence
from email.message import EmailMessage

from alerts.notifiers.base import GroupMessage, Outcome, rfc3339
from alerts.notifiers.config import EmailConfig, ReceiverConfig
from alerts.notifiers.targets import IPNetwork, TargetRefused, connect_checked


def build(message: GroupMessage, config: EmailConfig) -> EmailMessage:
    mail = EmailMessage()
    mail["Subject"] = message.title()
    mail["From"] = config.sender
    mail["To"] = ", ".join(config.to)
    mail["Message-ID"] = f"<{message.idempotency_key}@tuneloop>"
    lines = [message.title(), ""]
    for alert in message.alerts:
        lines.append(f"[{alert.event.upper()}] {alert.labels.get('alertname', '')}")
        lines.extend(f"  {key}: {value}" for key, value in alert.annotations.items())
        labels = ", ".join(f'{key}="{value}"' for key, value in sorted(alert.labels.items()))
        lines.append(f"  labels: {labels}")
        lines.append(f"  since: {rfc3339(alert.starts_at)}")
        if alert.event == "resolved":
            lines.append(f"  resolved: {rfc3339(alert.ends_at)}")
        lines.append("")
    if message.external_url:
        lines.append(message.external_url)
    mail.set_content("\n".join(lines))
    return mail


class _CheckedSMTP(smtplib.SMTP):
    """Connects to a checked address of the host; STARTTLS still verifies the host name."""

    def __init__(self, allowed: Sequence[IPNetwork], host: str, port: int, timeout: float) -> None:
        self.allowed = allowed
        super().__init__(host, port, timeout=timeout)

    def _get_socket(self, host: str, port: int, timeout: float) -> socket.socket:
        return connect_checked(host, port, self.allowed, timeout)


class EmailNotifier:
    def __init__(self, allowed: Sequence[IPNetwork] = ()) -> None:
        self.allowed = tuple(allowed)

    def send(self, config: ReceiverConfig, message: GroupMessage) -> Outcome:
        assert isinstance(config, EmailConfig)
        mail = build(message, config)
        try:
            with _CheckedSMTP(self.allowed, config.host, config.port, config.timeout_s) as smtp:
                if config.starttls:
                    smtp.starttls()
                if config.username:
                    smtp.login(config.username, config.password or "")
                refused = smtp.send_message(mail)
        except TargetRefused as exc:
            return Outcome("failed", error=str(exc))
        except smtplib.SMTPResponseException as exc:
            return _reply(exc.smtp_code)
        except smtplib.SMTPRecipientsRefused as exc:
            code, _ = next(iter(exc.recipients.values()))
            return _reply(code)
        except TimeoutError:
            return Outcome("retry", error=f"timed out after {config.timeout_s:g}s")
        except (OSError, smtplib.SMTPException) as exc:
            return Outcome("retry", error=f"SMTP session failed ({type(exc).__name__})")
        if refused:
            return Outcome("failed", error=f"recipients refused: {', '.join(sorted(refused))}")
        return Outcome.sent(250)


def _reply(code: int) -> Outcome:
    temporary = 400 <= code < 500
    error = f"SMTP {code}: {'temporary' if temporary else 'permanent'} failure"
    return Outcome("retry" if temporary else "failed", error=error, code=code)
