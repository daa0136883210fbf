"""The Alerts dashboard: what fires now, what fired recently, whether notifications got out."""

from __future__ import annotations

from dashboards.board import PROJECT_VARIABLE, Board

RULES_OF_PROJECT = (
    "FROM alert_instances AS i JOIN alert_rules AS r ON r.id = i.rule_id\n"
    "JOIN projects AS p ON p.id = r.project_id\n"
    "WHERE p.name = ${project:sqlstring}"
)


def alerts() -> Board:
    board = Board(
        "tuneloop-alerts",
        "Alerts",
        "What fires now, what fired recently, and whether the notifications got out.",
        variables=[PROJECT_VARIABLE],
        time_from="now-24h",
    )
    board.add(
        "table",
        "Firing now",
        "Alert instances of the project's rules that fire now: since when, the rule, its "
        "severity, the instance's labels and the value that made it fire.",
        "SELECT i.fired_at AS time, r.name AS rule, r.severity, i.labels::text AS labels,\n"
        "       i.value\n"
        f"{RULES_OF_PROJECT} AND i.state = 'firing'\n"
        "ORDER BY 1 DESC, 2",
        unit="none",
        fmt="table",
        width=24,
    )
    board.add(
        "table",
        "Recent alerts",
        "Alert instances that fired within the dashboard's time range, firing or resolved.",
        "SELECT i.fired_at AS time, r.name AS rule, r.severity, i.state,\n"
        "       i.resolved_at, i.labels::text AS labels\n"
        f"{RULES_OF_PROJECT} AND $__timeFilter(i.fired_at)\n"
        "ORDER BY 1 DESC, 2",
        unit="none",
        fmt="table",
        width=24,
    )
    board.add(
        "timeseries",
        "Notifications by outcome",
        "Notifications created per interval, by outcome (sent, failed, pending).",
        "SELECT $__timeGroupAlias(n.created_at, $__interval), n.status AS metric,"
        " count(*) AS value\n"
        "FROM notifications AS n JOIN alert_instances AS i ON i.id = n.instance_id\n"
        "JOIN alert_rules AS r ON r.id = i.rule_id JOIN projects AS p ON p.id = r.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND $__timeFilter(n.created_at)\n"
        "GROUP BY 1, 2\n"
        "ORDER BY 1, 2",
        unit="none",
    )
    board.add(
        "table",
        "Failed or pending notifications",
        "Notifications not sent (yet): the receiver, the attempts so far and the last error.",
        "SELECT n.created_at AS time, r.name AS rule, n.receiver, n.event, n.status,\n"
        "       n.attempts, n.last_error\n"
        "FROM notifications AS n JOIN alert_instances AS i ON i.id = n.instance_id\n"
        "JOIN alert_rules AS r ON r.id = i.rule_id JOIN projects AS p ON p.id = r.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND n.status <> 'sent'\n"
        "  AND $__timeFilter(n.created_at)\n"
        "ORDER BY 1 DESC",
        unit="none",
        fmt="table",
    )
    return board
