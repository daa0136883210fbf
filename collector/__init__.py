"""Collectors: sources -> pipeline -> sinks, as the OpenTelemetry Collector's receivers,
processors and exporters. Each source gets what it reads (a library handle, a sysfs root, a URL)
through its constructor, so tests point it at recorded inputs.

The API and the commands use the modules in ``__all__``: ``service`` (builds the pipeline and
the collector from settings), ``pipeline`` (the one write queue the API's receivers submit to),
``otlp`` (the OTLP/HTTP receiver's logic), ``sources`` and ``relabel`` (their configuration
errors) and ``status`` (what each source last did). Sinks, the spool and the runner are this
component's own. See docs/architecture.md.
"""

# Modules, not names: importing the package loads none of them.
__all__ = ["otlp", "pipeline", "relabel", "service", "sources", "status"]
