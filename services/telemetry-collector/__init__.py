"""Kinference telemetry collector (``kinference-telemetry-collector``).

Scrapes every vLLM endpoint's ``/metrics`` and DCGM exporters, derives
per-endpoint state, aggregates routers' provider observations, and publishes
both on NATS (subjects and the ``kinference-telemetry`` KV bucket).

Modules, one concern each:

- :mod:`.promparse`: specialised Prometheus text parsers (vLLM, DCGM); pure.
- :mod:`.derive`: samples -> :class:`~kinference_common.messages.EndpointState`; pure.
- :mod:`.providers`: observations -> ProviderState; pure.
- :mod:`.discovery`: the ``Discovery`` Protocol and the static endpoint file.
- :mod:`.scrape`: bounded HTTP fetches.
- :mod:`.publish`: change-or-rate publishing to subjects and KV.
- :mod:`.metrics`: the collector's own Prometheus metrics and HTTP server.
- :mod:`.service`: the scrape loops and the service's lifecycle.
- :mod:`.pages`: exposition pages rendered from numbers (tests, benchmarks).
"""
