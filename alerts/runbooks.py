"""Runbook links of a rule pack: each rule's section of a published runbook page.

A pack names no address of its own (``runbook_base_url`` is empty by default): where
docs/runbooks.md is published is the operator's to say, in the pack, with
``TUNELOOP_ALERTS_RUNBOOK_BASE_URL`` when loading, or with ``--runbook-base-url`` when
exporting Prometheus rules. A rule's section is its name in lower case, the anchor a Markdown
renderer gives its ``## RuleName`` heading."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from alerts.rules import RuleDefinition

ANNOTATION = "runbook_url"


def check_base_url(value: object) -> str | None:
    """A problem with ``value`` as a runbook base URL, or None: empty, or an http(s) URL."""
    if not isinstance(value, str):
        return "runbook_base_url: expected a string"
    parts = urlsplit(value)
    if value and (parts.scheme not in ("http", "https") or not parts.netloc or parts.fragment):
        return f"runbook_base_url: expected an http(s) URL without a #section, got {value!r}"
    return None


def runbook_url(base_url: str, rule_name: str) -> str:
    return f"{base_url}#{rule_name.lower()}"


def with_runbook_links(rules: Sequence[RuleDefinition], base_url: str) -> list[RuleDefinition]:
    """``rules``, each without a ``runbook_url`` of its own given its section of ``base_url``
    (unchanged when ``base_url`` is empty)."""
    if not base_url:
        return list(rules)
    return [
        rule
        if ANNOTATION in rule.annotations
        else rule.model_copy(
            update={
                "annotations": {**rule.annotations, ANNOTATION: runbook_url(base_url, rule.name)}
            }
        )
        for rule in rules
    ]
