"""Metric sources. Every source follows :class:`collector.sources.base.Source`."""
