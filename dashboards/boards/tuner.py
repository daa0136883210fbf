"""The Tuner dashboard: studies, their trials, the best value over time, config changes."""

from __future__ import annotations

from dashboards.board import PROJECT_VARIABLE, Board


def tuner() -> Board:
    board = Board(
        "tuneloop-tuner",
        "Tuner",
        "Studies, their trials, the best value found over time, config changes and rollbacks.",
        variables=[PROJECT_VARIABLE],
        time_from="now-7d",
    )
    board.add(
        "table",
        "Studies",
        "Every study of the project: its job, objective, direction, strategy, state, "
        "completed trials and the best value so far.",
        "SELECT st.name AS study, j.name AS job, st.objective, st.direction, st.strategy,\n"
        "       st.state, count(t.id) AS trials,\n"
        "       CASE WHEN st.direction = 'minimize' THEN min(t.value) ELSE max(t.value) END"
        " AS best\n"
        "FROM studies AS st JOIN jobs AS j ON j.id = st.job_id\n"
        "JOIN projects AS p ON p.id = j.project_id\n"
        "LEFT JOIN trials AS t ON t.study_id = st.id AND t.state = 'complete'\n"
        "WHERE p.name = ${project:sqlstring}\n"
        "GROUP BY st.id, j.name\n"
        "ORDER BY st.created_at DESC, st.name",
        unit="none",
        fmt="table",
        width=24,
    )
    board.add(
        "timeseries",
        "Best value so far per study",
        "The best objective value of each study after each completed trial.",
        "SELECT t.completed_at AS time, st.name AS metric,\n"
        "       CASE WHEN st.direction = 'minimize'\n"
        "            THEN min(t.value) OVER w ELSE max(t.value) OVER w END AS value\n"
        "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
        "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND t.state = 'complete'\n"
        "  AND t.completed_at <= $__timeTo()\n"
        "WINDOW w AS (PARTITION BY st.id ORDER BY t.completed_at, t.number)\n"
        "ORDER BY 1, 2",
        unit="none",
    )
    board.add(
        "table",
        "Trials",
        "Trials started within the time range: state, value and the parameters tried.",
        "SELECT t.started_at AS time, st.name AS study, t.number, t.state, t.value,\n"
        "       t.params::text AS params\n"
        "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
        "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND $__timeFilter(t.started_at)\n"
        "ORDER BY 1 DESC, 2, 3",
        unit="none",
        fmt="table",
    )
    board.add(
        "table",
        "Config changes",
        "Job configurations written within the time range, by whom (tuner, user) and what.",
        "SELECT c.created_at AS time, j.name AS job, c.kind, c.version, c.source,\n"
        "       c.config::text AS config\n"
        "FROM job_configs AS c JOIN jobs AS j ON j.id = c.job_id\n"
        "JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND $__timeFilter(c.created_at)\n"
        "ORDER BY 1 DESC, 2",
        unit="none",
        fmt="table",
    )
    board.add(
        "table",
        "Rollbacks",
        "Audit entries of rollbacks: a config put back after a trial made things worse.",
        "SELECT a.created_at AS time, a.actor, a.action, a.target, a.details::text AS details\n"
        "FROM audit_log AS a JOIN projects AS p ON p.id = a.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND a.action LIKE '%rollback%'\n"
        "  AND $__timeFilter(a.created_at)\n"
        "ORDER BY 1 DESC",
        unit="none",
        fmt="table",
        width=24,
    )
    return board
