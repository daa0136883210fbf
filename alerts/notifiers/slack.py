"""Slack incoming webhooks: a JSON body with ``text`` (the notification's fallback and
push-notification text) and ``blocks`` (what the channel shows). Slack answers 200 ``ok``, or
4xx with a reason such as ``invalid_payload`` or ``no_service``, which retrying cannot fix."""

from __future__ import annotations

from typing import Any

import httpx

from alerts.notifiers.base import GroupMessage, Outcome, post_json
from alerts.notifiers.config import ReceiverConfig, SlackConfig

SECTION_LIMIT = 3000
"""Slack's limit on a section block's text."""


def payload(message: GroupMessage, config: SlackConfig) -> dict[str, Any]:
    title = message.title()
    lines = []
    for alert in message.alerts:
        mark = ":red_circle:" if alert.event == "firing" else ":large_green_circle:"
        summary = alert.annotations.get("summary") or alert.labels.get("alertname", "")
        line = f"{mark} *{summary}*"
        if description := alert.annotations.get("description"):
            line += f"\n    {description}"
        # The pack links runbooks (runbook_url, as PagerDuty and Alertmanager read them);
        # older rules wrote the steps inline (runbook).
        if runbook := alert.annotations.get("runbook_url") or alert.annotations.get("runbook"):
            line += f"\n    runbook: {runbook}"
        lines.append(line)
    text = "\n".join(lines)
    if len(text) > SECTION_LIMIT:
        text = text[: SECTION_LIMIT - 1] + "…"
    body: dict[str, Any] = {
        "text": title,
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": text or title}},
        ],
    }
    if config.channel:
        body["channel"] = config.channel
    if config.username:
        body["username"] = config.username
    return body


class SlackNotifier:
    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def send(self, config: ReceiverConfig, message: GroupMessage) -> Outcome:
        assert isinstance(config, SlackConfig)
        return post_json(
            self.client, config.url, payload(message, config), timeout_s=config.timeout_s
        )
