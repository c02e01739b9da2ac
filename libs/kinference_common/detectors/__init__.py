"""The built-in classifiers' detectors (PII, prompt injection): pure
functions of a request's texts, no I/O.

Shared code because two processes run them: the classifier service (over
NATS, the default) and the router, when an operator runs a classifier in the
router's process (no prompt on the bus; see docs/classification.md).
:class:`.core.Classifiers` is the whole API.
"""
