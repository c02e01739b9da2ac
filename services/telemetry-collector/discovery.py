"""Where the collector's scrape targets come from, behind one small Protocol.

Today: a static endpoint file (YAML or JSON) plus DCGM exporter addresses
given on the command line. The Kubernetes watch (pods of each worker set,
DCGM exporter pods) comes later behind the same :class:`Discovery` Protocol.

The endpoint file is either a list of endpoints or a mapping::

    endpoints:
      - {namespace: default, workerSet: llama, pod: llama-0, address: "10.0.0.7:8000",
         model: meta-llama/Llama-3.1-8B-Instruct, ready: true}
    dcgm:
      - {address: "10.0.0.2:9400"}

The file is read again when its modification time changes; a file that
cannot be read keeps the last good target list (and is logged), so a bad
edit never drops every endpoint.
"""

from __future__ import annotations

import os
from typing import Literal, Protocol

import msgspec
import structlog
import yaml

log = structlog.get_logger("kinference.collector.discovery")

TargetKind = Literal["vllm", "dcgm"]


class Target(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One thing to scrape. For ``dcgm`` only ``address`` matters."""

    kind: TargetKind = "vllm"
    address: str
    namespace: str = ""
    worker_set: str = ""
    pod: str = ""
    model: str = ""
    #: Kubernetes readiness as discovery reports it
    ready: bool = True

    @property
    def key(self) -> tuple[str, str, str, str]:
        """Identity of the target: the pod for an endpoint (its KV key), the address for DCGM."""
        if self.kind == "dcgm":
            return ("dcgm", self.address, "", "")
        return ("vllm", self.namespace, self.worker_set, self.pod)

    @property
    def base_url(self) -> str:
        a = self.address
        return a.rstrip("/") if a.startswith(("http://", "https://")) else f"http://{a}"


class Discovery(Protocol):
    """Anything that can say what to scrape right now."""

    async def endpoints(self) -> list[Target]: ...


class _EndpointEntry(msgspec.Struct, kw_only=True, rename="camel", forbid_unknown_fields=False):
    namespace: str = "default"
    worker_set: str
    pod: str
    address: str
    model: str = ""
    ready: bool = True


class _DcgmEntry(msgspec.Struct, kw_only=True):
    address: str


class _File(msgspec.Struct, kw_only=True):
    endpoints: list[_EndpointEntry] = []
    dcgm: list[_DcgmEntry] = []


class DiscoveryError(ValueError):
    pass


def parse_endpoint_file(text: str) -> list[Target]:
    """The targets of an endpoint file's text; :class:`DiscoveryError` says why not."""
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise DiscoveryError(f"not valid YAML/JSON: {exc}") from None
    if raw is None:
        return []
    if isinstance(raw, list):
        raw = {"endpoints": raw}
    try:
        f = msgspec.convert(raw, _File, strict=False)
    except msgspec.ValidationError as exc:
        raise DiscoveryError(str(exc)) from None
    out = [
        Target(kind="vllm", namespace=e.namespace, worker_set=e.worker_set, pod=e.pod,
               address=e.address, model=e.model, ready=e.ready)
        for e in f.endpoints
    ]
    out.extend(Target(kind="dcgm", address=d.address) for d in f.dcgm)
    return out


class StaticDiscovery:
    """Targets from an endpoint file (re-read on change) and fixed DCGM addresses."""

    def __init__(self, path: str | None = None, dcgm: list[str] | None = None) -> None:
        self._path = path
        self._dcgm = [Target(kind="dcgm", address=a) for a in (dcgm or [])]
        self._mtime: float | None = None
        self._targets: list[Target] = []

    async def endpoints(self) -> list[Target]:
        if self._path is not None:
            self._reload()
        return [*self._targets, *self._dcgm]

    def _reload(self) -> None:
        assert self._path is not None
        try:
            mtime = os.stat(self._path).st_mtime_ns
            if mtime == self._mtime:
                return
            with open(self._path, encoding="utf-8") as fh:
                text = fh.read()
            self._targets = parse_endpoint_file(text)
            self._mtime = mtime
            log.info("endpoints_loaded", path=self._path, targets=len(self._targets))
        except (OSError, UnicodeDecodeError, DiscoveryError) as exc:
            log.warning("endpoints_unreadable", path=self._path, error=str(exc)[:500])


class ListDiscovery:
    """A fixed list, changeable in place (tests, embedding)."""

    def __init__(self, targets: list[Target] | None = None) -> None:
        self.targets = list(targets or [])

    async def endpoints(self) -> list[Target]:
        return list(self.targets)
