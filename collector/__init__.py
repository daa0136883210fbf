"""Collectors: sources -> pipeline -> sinks, as the OpenTelemetry Collector's receivers,
processors and exporters. Each source gets what it reads (a library handle, a sysfs root, a URL)
through its constructor, so tests point it at recorded inputs.

The API and the commands use the modules in ``__all__``: ``service`` (builds the pipeline and
the collector from settings), ``pipeline`` (the one write queue the API's receivers submit to),
``fanout`` (the store's pipeline and the forwards' together), ``otlp`` and ``remote_write``
(the OTLP/HTTP and Prometheus remote-write receivers' logic), ``sources`` and ``relabel``
(their configuration errors) and ``status`` (what each source last did). Sinks, the spool
and the runner are this component's own. See docs/architecture.md.
"""

# Modules, not names: importing the package loads none of them.
__all__ = ["fanout", "otlp", "pipeline", "relabel", "remote_write", "service", "sources", "status"]
