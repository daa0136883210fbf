"""The Job dashboard: one training job's step time and its phases, throughput and goodput."""

from __future__ import annotations

from dashboards.board import PROJECT_VARIABLE, Board, annotation, query_variable
from dashboards.panel_sql import GPU_NAME, JOB_FILTER, gauge_sql, grouped_sql

JOBS_OF_PROJECT = (
    "SELECT j.name FROM jobs AS j JOIN projects AS p ON p.id = j.project_id "
    "WHERE p.name = ${project:sqlstring} "
    "UNION SELECT s.labels->>'job' FROM series AS s JOIN projects AS p ON p.id = s.project_id "
    "WHERE p.name = ${project:sqlstring} AND s.metric = 'tuneloop_step_duration_seconds' "
    "ORDER BY 1"
)
JOB_OF_PROJECT = (
    "FROM jobs AS j JOIN projects AS p ON p.id = j.project_id "
    "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}"
)


def job() -> Board:
    board = Board(
        "tuneloop-job",
        "Job",
        "One training job: step time and its phases, throughput, goodput measured by the "
        "tuner, the GPUs it runs on; the tuner's trials and config changes as annotations.",
        variables=[PROJECT_VARIABLE, query_variable("job", "Job", JOBS_OF_PROJECT, refresh=2)],
        annotations=[
            annotation(
                "Trials",
                "SELECT t.started_at AS time, t.completed_at AS timeend,\n"
                "       'trial ' || t.number || ' ' || t.state || ': ' || t.params::text AS text,\n"
                "       st.name AS tags\n"
                "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
                "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
                "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}\n"
                "  AND $__timeFilter(t.started_at)\n"
                "ORDER BY 1",
                "purple",
            ),
            annotation(
                "Config changes",
                "SELECT c.created_at AS time,\n"
                "       c.kind || ' v' || c.version || ' by ' || c.source || ': '"
                " || c.config::text AS text,\n"
                "       c.kind AS tags\n"
                "FROM job_configs AS c JOIN jobs AS j ON j.id = c.job_id\n"
                "JOIN projects AS p ON p.id = j.project_id\n"
                "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}\n"
                "  AND $__timeFilter(c.created_at)\n"
                "ORDER BY 1",
                "orange",
            ),
        ],
    )
    board.add(
        "timeseries",
        "Step time per rank",
        "Mean training step time of each rank of the job per interval; one slow rank "
        "holds back all others.",
        gauge_sql("tuneloop_step_duration_seconds", "'rank ' || (labels->>'rank')", JOB_FILTER),
        unit="s",
    )
    board.add(
        "timeseries",
        "Step phases (mean over ranks)",
        "Where a step's time goes (data loading, forward, backward, optimizer...), "
        "averaged over the ranks.",
        grouped_sql(
            "tuneloop_step_phase_seconds", "labels->>'phase'", JOB_FILTER, "sum(sum) / sum(count)"
        ),
        unit="s",
    )
    board.add(
        "timeseries",
        "Step time by phase (diagnosis)",
        "The share of the job's step in each phase, as the job's diagnosis finds it over its "
        "window (tuneloop_job_phase_share, docs/diagnosis.md), stacked: the gap up to 100% is "
        "time outside every phase; over 100%, phases overlap.",
        grouped_sql("tuneloop_job_phase_share", "labels->>'phase'", JOB_FILTER, "avg(avg)"),
        unit="percentunit",
        stacked=True,
    )
    board.add(
        "timeseries",
        "MFU (diagnosis)",
        "Model FLOPs utilisation: achieved FLOP/s per GPU over the GPU's peak, from the FLOPs "
        "per sample the job reports (tuneloop_job_mfu_ratio, docs/diagnosis.md). Empty when the "
        "job reports none, or when its figure implies more than the peak.",
        grouped_sql("tuneloop_job_mfu_ratio", "'MFU'", JOB_FILTER, "avg(avg)"),
        unit="percentunit",
    )
    board.add(
        "timeseries",
        "Samples per second (all ranks)",
        "Training throughput: the samples per second of all ranks together.",
        grouped_sql("tuneloop_samples_per_second", "'samples/s'", JOB_FILTER, "sum(avg)"),
        unit="none",
    )
    board.add(
        "timeseries",
        "Goodput measured per trial",
        "The goodput each completed tuner trial measured, per study.",
        "SELECT t.completed_at AS time, st.name AS metric, t.value AS value\n"
        "FROM trials AS t JOIN studies AS st ON st.id = t.study_id\n"
        "JOIN jobs AS j ON j.id = st.job_id JOIN projects AS p ON p.id = j.project_id\n"
        "WHERE p.name = ${project:sqlstring} AND j.name = ${job:sqlstring}\n"
        "  AND st.objective = 'goodput' AND t.state = 'complete'\n"
        "  AND $__timeFilter(t.completed_at)\n"
        "ORDER BY 1, 2",
        unit="none",
    )
    board.add(
        "timeseries",
        "GPU utilization of the job's GPUs",
        "Utilization of the GPUs whose job label is this job (dcgm-exporter's "
        "DCGM_FI_DEV_GPU_UTIL).",
        gauge_sql("DCGM_FI_DEV_GPU_UTIL", GPU_NAME, JOB_FILTER),
        unit="percent",
        width=24,
    )
    return board
