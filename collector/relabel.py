"""Relabel rules: the part of Prometheus's ``relabel_config`` that applies to stored series.

Actions: ``replace``, ``keep``, ``drop``, ``labeldrop``, ``labelkeep``, ``labelmap``, with
Prometheus's defaults (``separator: ";"``, ``regex: "(.*)"``, ``replacement: "$1"``) and its
semantics: regexes are fully anchored; the metric name is the label ``__name__``; a label set to
the empty string is removed; ``$1``, ``${1}``, ``$name`` and ``${name}`` in a replacement refer
to groups (Go's expansion rules, so ``$1x`` is the group named ``1x``, write ``${1}x``); labels
whose names start with ``__`` (other than ``__name__``) are removed after the last rule, so rules
can pass values to each other through ``__tmp_...`` labels.

Rules are read from a YAML or JSON file (a list of rules, or ``{relabel_configs: [...]}``) and
checked when the process starts: a mistake stops start-up with one line naming the rule.
Regexes are RE2, as in Prometheus (:mod:`tuneloop.regex`): matching is linear in the label
value, and what RE2 lacks (backreferences, lookarounds) is refused at start-up.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml

from tuneloop.errors import InvalidInput
from tuneloop.regex import InvalidRegex, Regex, RegexMatch, compile_anchored
from tuneloop.storage.timeseries.columns import Batch, expand
from tuneloop.storage.timeseries.types import SeriesBatch
from tuneloop.strict import refuse_unknown_keys

NAME_LABEL: Final = "__name__"
ACTIONS: Final = ("replace", "keep", "drop", "labeldrop", "labelkeep", "labelmap")
MAX_REGEX_LENGTH: Final = 1000
MAX_RULES: Final = 1000

_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_TEMPLATE = re.compile(r"\$(?:\$|\{([a-zA-Z0-9_]+)\}|([a-zA-Z0-9_]+))")
_FIELDS = {"action", "source_labels", "separator", "regex", "target_label", "replacement"}
QUOTED: Final = "{where}unknown {noun} {names}; known: {known}"
"""Unknown keys as YAML shows them, quoted one by one."""
# labeldrop/labelkeep act on label names only; Prometheus refuses other fields with them.
_NAME_ONLY_FIELDS = {"action", "regex"}


class RelabelConfigError(InvalidInput):
    """An invalid relabel configuration; ``str()`` is one line naming the rule and the field."""


@dataclass(frozen=True, slots=True)
class Rule:
    action: str
    regex: Regex
    source_labels: tuple[str, ...] = ()
    separator: str = ";"
    target_label: str = ""
    replacement: str = "$1"


# --------------------------------------------------------------------------- loading


def load_rules(path: Path) -> list[Rule]:
    """Read and check the rules in ``path`` (YAML or JSON)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise RelabelConfigError(f"relabel config {path}: cannot read it: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise RelabelConfigError(f"relabel config {path}: not valid YAML/JSON{line}") from None
    return parse_rules(data, source=str(path))


def parse_rules(data: Any, *, source: str = "relabel config") -> list[Rule]:
    """Check a decoded configuration (a list of rule mappings, or a mapping holding one under
    ``relabel_configs``); empty or ``None`` means no rules."""
    if isinstance(data, Mapping):
        # Expected: a list of rules, or relabel_configs: [...].
        refuse_unknown_keys(
            data,
            ("relabel_configs",),
            error=RelabelConfigError,
            where=source,
            noun="top-level key",
            message=QUOTED,
        )
        data = data.get("relabel_configs")
    if data is None:
        return []
    if not isinstance(data, list):
        raise RelabelConfigError(f"{source}: expected a list of rules")
    if len(data) > MAX_RULES:
        raise RelabelConfigError(f"{source}: more than {MAX_RULES} rules")
    return [_parse_rule(item, f"{source}: rule {index + 1}") for index, item in enumerate(data)]


def _parse_rule(item: Any, where: str) -> Rule:
    if not isinstance(item, Mapping):
        raise RelabelConfigError(f"{where}: expected a mapping of fields")
    refuse_unknown_keys(
        item, _FIELDS, error=RelabelConfigError, where=where, noun="field", message=QUOTED
    )
    action = item.get("action", "replace")
    if action not in ACTIONS:
        raise RelabelConfigError(
            f"{where}: action must be one of {', '.join(ACTIONS)}, got {action!r}"
        )
    if action in ("labeldrop", "labelkeep") and set(item) - _NAME_ONLY_FIELDS:
        extra = sorted(set(item) - _NAME_ONLY_FIELDS)[0]
        raise RelabelConfigError(f"{where}: {action} takes only regex, not {extra}")
    source_labels = item.get("source_labels", [])
    if not isinstance(source_labels, list) or not all(
        isinstance(name, str) and _LABEL_NAME.fullmatch(name) for name in source_labels
    ):
        raise RelabelConfigError(f"{where}: source_labels must be a list of label names")
    separator = _string(item, "separator", ";", where)
    replacement = _string(item, "replacement", "$1", where)
    target = _string(item, "target_label", "", where)
    if action == "replace":
        if not target:
            raise RelabelConfigError(f"{where}: replace needs target_label")
        # A target with $-references is checked after expansion, as Prometheus does.
        if "$" not in target and not _LABEL_NAME.fullmatch(target):
            raise RelabelConfigError(f"{where}: target_label {target!r} is not a label name")
    elif "target_label" in item:
        raise RelabelConfigError(f"{where}: {action} does not take target_label")
    if action in ("keep", "drop") and "replacement" in item:
        raise RelabelConfigError(f"{where}: {action} does not take replacement")
    regex = compile_regex(_string(item, "regex", "(.*)", where), where)
    return Rule(action, regex, tuple(source_labels), separator, target, replacement)


def _string(item: Mapping[str, Any], key: str, default: str, where: str) -> str:
    value = item.get(key, default)
    if not isinstance(value, str):
        raise RelabelConfigError(f"{where}: {key} must be a string")
    return value


def compile_regex(pattern: str, where: str = "regex") -> Regex:
    """Compile ``pattern`` with RE2, anchored at both ends."""
    if len(pattern) > MAX_REGEX_LENGTH:
        raise RelabelConfigError(f"{where}: regex longer than {MAX_REGEX_LENGTH} characters")
    try:
        return compile_anchored(pattern)
    except InvalidRegex as exc:
        raise RelabelConfigError(f"{where}: invalid regex {pattern!r}: {exc.reason}") from None


# --------------------------------------------------------------------------- applying


def relabel(rules: Sequence[Rule], metric: str, labels: Mapping[str, str]) -> dict[str, str] | None:
    """The label set (with ``__name__``) after ``rules``, or ``None`` when a rule dropped it."""
    current = dict(labels)
    current[NAME_LABEL] = metric
    for rule in rules:
        if not _apply(rule, current):
            return None
    return {
        name: value
        for name, value in current.items()
        if name == NAME_LABEL or not name.startswith("__")
    }


def _apply(rule: Rule, labels: dict[str, str]) -> bool:
    """Apply one rule in place; ``False`` means drop the series."""
    action = rule.action
    if action in ("labeldrop", "labelkeep"):
        keep_matching = action == "labelkeep"
        for name in list(labels):
            if (rule.regex.fullmatch(name) is not None) != keep_matching:
                del labels[name]
        return True
    if action == "labelmap":
        for name, value in list(labels.items()):
            match = rule.regex.fullmatch(name)
            if match is not None:
                labels[_expand(rule.replacement, match, rule.regex.groups)] = value
        return True
    value = rule.separator.join(labels.get(name, "") for name in rule.source_labels)
    match = rule.regex.fullmatch(value)
    if action == "keep":
        return match is not None
    if action == "drop":
        return match is None
    # replace
    if match is not None:
        target = _expand(rule.target_label, match, rule.regex.groups)
        if _LABEL_NAME.fullmatch(target):
            result = _expand(rule.replacement, match, rule.regex.groups)
            if result:
                labels[target] = result
            else:
                labels.pop(target, None)
    return True


def _expand(template: str, match: RegexMatch, groups: int) -> str:
    if "$" not in template:
        return template

    def group(found: re.Match[str]) -> str:
        if found.group(0) == "$$":
            return "$"
        name = found.group(1) or found.group(2)
        if name.isdigit():
            index = int(name)
            return (match.group(index) or "") if index <= groups else ""
        return match.groupdict().get(name) or ""

    return _TEMPLATE.sub(group, template)


class Relabeler:
    """Applies rules to whole batches. With no rules it returns its input as is."""

    def __init__(self, rules: Sequence[Rule] = ()) -> None:
        self.rules = tuple(rules)

    def __bool__(self) -> bool:
        return bool(self.rules)

    def apply(self, batches: Sequence[Batch]) -> tuple[list[Batch], int]:
        """(batches to keep, relabelled; samples dropped by keep/drop rules). A batch whose
        metric or labels are not strings passes untouched, for the store to reject. Without
        rules everything passes as it is; with rules a block (SampleColumns) is relabelled as
        the batches it means."""
        if not self.rules:
            return list(batches), 0
        kept: list[Batch] = []
        dropped = 0
        for batch in expand(batches):
            try:
                result = relabel(self.rules, batch.metric, batch.labels)
            except (TypeError, ValueError, AttributeError):
                kept.append(batch)
                continue
            if result is None:
                dropped += _size(batch)
                continue
            metric = result.pop(NAME_LABEL, "")
            kept.append(SeriesBatch(metric, result, batch.timestamps, batch.values, batch.kind))
        return kept, dropped


def _size(batch: SeriesBatch) -> int:
    try:
        return len(batch.values)
    except TypeError:
        return 0
