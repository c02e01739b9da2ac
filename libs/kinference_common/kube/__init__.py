"""Talking to a Kubernetes API server, shared by the services' Kubernetes
modes. Small modules, one concern each, on the real ``kubernetes_asyncio``
client:

- :mod:`.config`: where the API server is (``--kubeconfig``, in-cluster,
  ``~/.kube/config``) and an ``ApiClient`` for it.
- :mod:`.kinds`: the resources Kinference reads and writes
  (group, version, plural, kind).
- :mod:`.client`: list, watch, get, create, update, merge patch, status
  patch of any kind, as plain dicts.
- :mod:`.informer`: list then watch into a local cache; relist on 410 and on
  errors with jittered exponential backoff; changes only wake a
  level-triggered reconcile.
- :mod:`.status`: write a status through the status subresource, only when
  it differs, keeping ``lastTransitionTime``; 409 retried on a fresh read.
- :mod:`.events`: ``events.k8s.io/v1`` Events, one per (object, reason,
  message) with a rising ``series.count``.
- :mod:`.lease`: leader election on a ``coordination.k8s.io/v1`` Lease.
- :mod:`.rbac`: the API calls each service makes (its RBAC rules).
"""
