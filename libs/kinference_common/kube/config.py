"""Where the API server is: ``--kubeconfig FILE`` when given, else the
in-cluster service account (``KUBERNETES_SERVICE_HOST`` and the mounted
token), else ``~/.kube/config`` (or ``$KUBECONFIG``). A missing or broken
configuration is a :class:`KubeConfigError` naming what is wrong."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import yaml
from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException


class KubeConfigError(Exception):
    pass


#: what a broken kubeconfig file raises inside the client's loader (a
#: YAML syntax error; a list or a string where a mapping belongs)
_BROKEN = (ConfigException, OSError, ValueError, TypeError, KeyError, AttributeError, yaml.YAMLError)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


async def load_configuration(kubeconfig: str | os.PathLike[str] | None = None) -> client.Configuration:
    """A client Configuration from the first source that exists."""
    conf = client.Configuration()
    if kubeconfig:
        path = Path(kubeconfig)
        if not path.is_file():
            raise KubeConfigError(f"--kubeconfig {path}: no such file")
        try:
            await config.load_kube_config(config_file=str(path), client_configuration=conf)
        except _BROKEN as exc:
            raise KubeConfigError(f"--kubeconfig {path}: {_one_line(exc)}") from None
        return conf
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            config.load_incluster_config(client_configuration=conf)
            return conf
        except ConfigException as exc:
            raise KubeConfigError(f"in-cluster configuration: {_one_line(exc)}") from None
    default = Path(os.environ.get("KUBECONFIG", "~/.kube/config").split(os.pathsep)[0]).expanduser()
    if not default.is_file():
        raise KubeConfigError(
            "no Kubernetes configuration: give --kubeconfig FILE, run in a pod (in-cluster "
            f"service account), or create {default}")
    try:
        await config.load_kube_config(config_file=str(default), client_configuration=conf)
    except _BROKEN as exc:
        raise KubeConfigError(f"{default}: {_one_line(exc)}") from None
    return conf


async def api_client(kubeconfig: str | os.PathLike[str] | None, user_agent: str) -> client.ApiClient:
    """An ``ApiClient`` (close it with ``await api.close()``) whose requests
    carry ``user_agent`` (the fake API server's request log keys on it)."""
    conf = await load_configuration(kubeconfig)
    # The client logs whole response bodies at debug level: Secrets' data
    # among them. Whatever a service's log level, never let those through.
    logging.getLogger("kubernetes_asyncio.client.rest").setLevel(logging.INFO)
    api = client.ApiClient(conf)
    api.user_agent = user_agent
    return api
