"""Kubernetes API use shared by the services (client configuration, informers,
status writers, events, leases) and the RBAC each service needs (:mod:`.rbac`)."""
