"""Kinference's classifier service (``kinference-classifier``).

Modules, one concern each:

- :mod:`.patterns`: candidate finding, Hyperscan with an identical ``re`` fallback;
- :mod:`.pii`, :mod:`.injection`: the detectors (pure functions of the texts);
- :mod:`.core`: :class:`~.core.Classifiers`, the in-process API, which fails closed
  (size cap, errors, deadline);
- :mod:`.inputs`: which parts of an OpenAI-style body are read;
- :mod:`.service`: NATS request/reply, health and metrics; :mod:`.__main__` runs it;
- :mod:`.client`: :func:`~.client.classify` / :func:`~.client.classify_body`, the
  router's side, which return the failure tag when the service errs, hangs or is
  absent. (They and :mod:`.inputs` import nothing of the service; if services must
  not import each other, they can move to ``kinference_common`` unchanged.)

Run it: ``kinference-classifier --nats-url nats://127.0.0.1:4222 --health-port 8083``.
Try it without NATS: ``echo '{"id": 1, "text": "mail me: a@b.org"}' | kinfctl classify``.
"""
