"""Kinference's development simulators: a vLLM engine, a DCGM exporter, a provider.

Run each as a process (``--help`` for the flags):

- ``python -m kinference_simulators.vllm``: vLLM's OpenAI API, ``/health``,
  ``/metrics`` (vLLM V1 names), ``/sim/state``; a step-loop scheduler model.
- ``python -m kinference_simulators.dcgm --gpu NS/POD=ENGINE_URL``: DCGM
  exporter ``/metrics`` driven by engine load; ``POST /sim/xid``.
- ``python -m kinference_simulators.provider --api-key K --model M``: an
  OpenAI-compatible provider with latency, 429/5xx/timeouts and
  ``GET /sim/requests`` (what it received).
- ``python -m kinference_simulators.plot_shape``: ``docs/simulator-shape.png``.

Modules, one concern each: :mod:`.tokens` (prompt token approximation, block
hashes), :mod:`.profiles` (GPU speed profiles), :mod:`.kvcache` (KV blocks,
prefix cache), :mod:`.scheduler` (the pure step loop), :mod:`.offline`
(simulated-time runs), :mod:`.engine` (asyncio driver), :mod:`.vllm_metrics`,
:mod:`.openai_api`, :mod:`.faults`, :mod:`.gpu` (DCGM readings), :mod:`.cli`,
:mod:`.testing` (helpers for tests that start simulators).
"""
