"""The router: Kinference's data plane.

An OpenAI-compatible HTTP endpoint (INTERFACES.md) that authenticates the
caller, rewrites and canonicalises the model, asks the classifiers the
applicable rules need, decides on an in-memory snapshot with the pure
decision engine (:mod:`kinference_common.engine`), proxies to the pick
(streaming), and records what happened. It keeps serving on its last
snapshot when NATS, the collector, the compiler or a classifier is down.
"""
