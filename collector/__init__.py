"""Collectors: sources -> pipeline -> sinks, as the OpenTelemetry Collector's receivers,
processors and exporters. Each source gets what it reads (a library handle, a sysfs root, a URL)
through its constructor, so tests point it at recorded inputs."""
