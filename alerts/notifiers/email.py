"""E-mail over SMTP (optionally STARTTLS and login). A 5xx SMTP reply (recipient refused,
authentication failed) is permanent; 4xx replies, timeouts and refused connections are
retried."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage

from alerts.notifiers.base import GroupMessage, Outcome, rfc3339
from alerts.notifiers.config import EmailConfig, ReceiverConfig


def build(message: GroupMessage, config: EmailConfig) -> EmailMessage:
    mail = EmailMessage()
    mail["Subject"] = message.title()
    mail["From"] = config.sender
    mail["To"] = ", ".join(config.to)
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


class EmailNotifier:
    def send(self, config: ReceiverConfig, message: GroupMessage) -> Outcome:
        assert isinstance(config, EmailConfig)
        mail = build(message, config)
        try:
            with smtplib.SMTP(config.host, config.port, timeout=config.timeout_s) as smtp:
                if config.starttls:
                    smtp.starttls()
                if config.username:
                    smtp.login(config.username, config.password or "")
                refused = smtp.send_message(mail)
        except smtplib.SMTPResponseException as exc:
            return _reply(exc.smtp_code, exc.smtp_error)
        except smtplib.SMTPRecipientsRefused as exc:
            code, text = next(iter(exc.recipients.values()))
            return _reply(code, text)
        except TimeoutError:
            return Outcome("retry", error=f"timed out after {config.timeout_s:g}s")
        except (OSError, smtplib.SMTPException) as exc:
            return Outcome("retry", error=f"{type(exc).__name__}: {exc}"[:500])
        if refused:
            return Outcome("failed", error=f"recipients refused: {', '.join(sorted(refused))}")
        return Outcome.sent(250)


def _reply(code: int, text: bytes | str) -> Outcome:
    reason = text.decode(errors="replace") if isinstance(text, bytes) else text
    error = f"SMTP {code}: {reason}"[:500]
    return Outcome("retry" if 400 <= code < 500 else "failed", error=error, code=code)
