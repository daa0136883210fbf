"""The knobs a job declared, as the API reads them: its newest agent registration's."""

from __future__ import annotations

from sqlalchemy.orm import Session

from tuneloop import job_agents
from tuneloop.storage.models import Job
from tuner.knobs import Knob, knobs_of


def declared_knobs(session: Session, job: Job) -> list[Knob]:
    """The knobs the job's newest agent registration declared (none without an agent)."""
    agent = job_agents.latest_agent(session, job)
    return knobs_of(agent.knobs) if agent is not None else []
