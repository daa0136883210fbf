"""Imports every command module so each registers itself on the app."""

from tuneloop.cli import serve  # noqa: F401
from tuneloop.cli import tokens as tokens  # token, project (re-export form: isort-clean)
from tuneloop.cli.alerts import alerts_app as alerts_app  # tuneloop alerts check|load
from tuneloop.cli.cost import cost_command as cost_command  # tuneloop cost
from tuneloop.cli.db import db_app as db_app  # tuneloop db upgrade|downgrade|current|check
from tuneloop.cli.demo import demo as demo  # tuneloop demo
from tuneloop.cli.jobs import job_app as job_app  # tuneloop job diagnose
from tuneloop.cli.prices import prices_app as prices_app  # tuneloop prices load
from tuneloop.cli.store import store_app as store_app  # tuneloop store compact
from tuneloop.cli.studies import study_app as study_app  # tuneloop study list|show
from tuneloop.cli.worker import worker as worker  # tuneloop worker, tuneloop beat
