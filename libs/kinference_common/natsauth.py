"""NATS authentication and authorisation: one user per service, each allowed
exactly the subjects its code uses; the shared command-line flags; the
nats-server configuration generator.

Why: the classify subjects carry prompts. Only routers may publish classify
requests and only classifiers may subscribe to them; nobody else may read
them (not with a wildcard, not through a JetStream stream, not through a
reply inbox).

Users (:data:`SERVICES`) and what each may do (:func:`permissions`):

=====================  ==========================================  =========================================
user                   publish                                     subscribe
=====================  ==========================================  =========================================
router                 classify requests (``kinference.classify.>``), ``_INBOX_router.>``, config and telemetry
                       decisions, observations, replica sync        subjects, replica sync (``kinference.router.>``:
                       (``kinference.router.>``); read-only          only routers read it)
                       JetStream API on both KV buckets; decision
                       records (``kinference.record.>``) and their
                       stream (create, set its limits)
policy-compiler        ``kinference.config.>``, its KV bucket       ``_INBOX_policy-compiler.>``
                       (create, put, read)
telemetry-collector    ``kinference.telemetry.>``, its KV buckets,  ``_INBOX_telemetry-collector.>``,
                       the replicas' GPU and alive subjects and     ``kinference.observations.>``, the
                       replies to probes (``allow_responses``)      GPU and alive subjects, endpoint states
classifier             nothing but replies to requests it got       ``kinference.classify.>`` (queue group)
                       (``allow_responses``)
observer (optional)    the JetStream API of the records stream      decisions and observations (``kinfctl events``)
                       (``kinfctl replay``, ``audit --since``)
=====================  ==========================================  =========================================

Each service connects with ``inbox_prefix=_INBOX_<user>`` so that its reply
subjects are its own: a router cannot read another service's replies. The
JetStream API is allowed per bucket (``$JS.API.*.*.KV_<bucket>`` and the
like); readers cannot create or change a stream (which could otherwise be
made to capture the classify subjects).

CLI: every service takes :func:`add_arguments` (``--nats-user``,
``--nats-password-file`` or env ``KINFERENCE_NATS_PASSWORD``,
``--nats-tls-ca``, ``--nats-tls-cert``, ``--nats-tls-key``) and passes
:func:`connect_options` to :func:`kinference_common.bus.connect`.

``python -m kinference_common.natsauth --help`` writes a nats-server
configuration for given (or generated) passwords, with an optional ``tls``
block; ``make run`` and the Kubernetes manifests use its output.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import ssl
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kinference_common import subjects
from kinference_common.natsserver import ClusterMember

ROUTER = "router"
COMPILER = "policy-compiler"
COLLECTOR = "telemetry-collector"
CLASSIFIER = "classifier"
OBSERVER = "observer"
#: the four services; :data:`OBSERVER` is an optional read-only user for people
SERVICES = (ROUTER, COMPILER, COLLECTOR, CLASSIFIER)
USERS = (*SERVICES, OBSERVER)

PASSWORD_ENV = "KINFERENCE_NATS_PASSWORD"


def inbox_prefix(user: str) -> str:
    """The reply-subject prefix of ``user`` (nats-py ``inbox_prefix``)."""
    return f"_INBOX_{user}"


def _kv_read(bucket: str) -> list[str]:
    """The JetStream API subjects a KV reader uses (get, keys, watch) on one bucket."""
    return _stream_read(f"KV_{bucket}")


def _stream_read(stream: str) -> list[str]:
    """The JetStream API subjects a reader of one stream uses (info, get, consumers)."""
    return [
        "$JS.API.INFO",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.MSG.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}",
        f"$JS.API.DIRECT.GET.{stream}.>",
        f"$JS.API.CONSUMER.CREATE.{stream}",
        f"$JS.API.CONSUMER.CREATE.{stream}.>",
        f"$JS.API.CONSUMER.DELETE.{stream}.>",
        f"$JS.API.CONSUMER.INFO.{stream}.>",
        f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
        "$JS.FC.>",
        "$JS.ACK.>",
    ]


def _kv_write(bucket: str) -> list[str]:
    """A KV owner: reads, creates its stream, puts and deletes keys. Never
    ``STREAM.UPDATE``: a stream's subjects could be changed to capture the
    classify subjects, whose prompts the owner could then read back (NATS
    permissions cannot restrict what an update changes). So a bucket found
    with fewer replicas than the cluster has (one made on a single server
    before a move to a cluster) is not healed by the services under
    authentication: :func:`bus.open_kv` says so once (docs/operations.md:
    growing from one server)."""
    stream = f"KV_{bucket}"
    return [*_kv_read(bucket), f"$JS.API.STREAM.CREATE.{stream}", f"$KV.{bucket}.>"]


#: the decision records' stream (kinference_common.recording; not imported here: it imports the engine)
RECORD_STREAM = "KINFERENCE_RECORDS"
RECORD_SUBJECTS = "kinference.record.>"


def _record_write() -> list[str]:
    """A router: publishes records, creates the stream and sets its limits
    (``STREAM.UPDATE``: a router that changed its subjects to capture the
    classify subjects would gain nothing: it publishes those prompts itself,
    and could publish them on its decisions subjects as well)."""
    return [RECORD_SUBJECTS, "$JS.API.INFO", f"$JS.API.STREAM.INFO.{RECORD_STREAM}",
            f"$JS.API.STREAM.CREATE.{RECORD_STREAM}", f"$JS.API.STREAM.UPDATE.{RECORD_STREAM}"]


def permissions(user: str) -> dict[str, Any]:
    """nats-server ``permissions`` for ``user``: allow lists only (anything
    not listed is denied)."""
    inbox = f"{inbox_prefix(user)}.>"
    classify = f"{subjects.CLASSIFY_PREFIX}.>"
    if user == ROUTER:
        return {
            "publish": {"allow": [classify, f"{subjects.DECISIONS_PREFIX}.>", f"{subjects.OBSERVATIONS_PREFIX}.>",
                                  f"{subjects.ROUTER_PREFIX}.>",
                                  *_kv_read(subjects.CONFIG_BUCKET),
                                  *[s for s in _kv_read(subjects.TELEMETRY_BUCKET) if s not in
                                    _kv_read(subjects.CONFIG_BUCKET)],
                                  *[s for s in _record_write() if s not in _kv_read(subjects.CONFIG_BUCKET)]]},
            "subscribe": {"allow": [inbox, f"{subjects.CONFIG_PREFIX}.>", "kinference.telemetry.>",
                                    f"{subjects.ROUTER_PREFIX}.>"]},
        }
    if user == COMPILER:
        return {"publish": {"allow": [f"{subjects.CONFIG_PREFIX}.>", *_kv_write(subjects.CONFIG_BUCKET)]},
                "subscribe": {"allow": [inbox]}}
    if user == COLLECTOR:
        # replicas share the fleet: their heartbeats in a bucket of their own, GPU stats on a subject
        members = [s for s in _kv_write(subjects.COLLECTORS_BUCKET) if s not in _kv_write(subjects.TELEMETRY_BUCKET)]
        # and each answers on its own alive subject (allow_responses: the answer to a probe)
        alive = f"{subjects.COLLECTOR_ALIVE_PREFIX}.>"
        return {"publish": {"allow": ["kinference.telemetry.>", *_kv_write(subjects.TELEMETRY_BUCKET), *members,
                                      subjects.COLLECTOR_GPU_SUBJECT, alive]},
                "subscribe": {"allow": [inbox, f"{subjects.OBSERVATIONS_PREFIX}.>", subjects.COLLECTOR_GPU_SUBJECT,
                                      f"{subjects.TELEMETRY_ENDPOINT_PREFIX}.>", alive]},
                "allow_responses": {"max": 1}}
    if user == CLASSIFIER:
        # replies only to the requests it received (allow_responses), nothing else
        return {"publish": {"deny": [">"]}, "subscribe": {"allow": [classify, inbox]},
                "allow_responses": {"max": 1}}
    if user == OBSERVER:
        # reads the decision records (kinfctl replay, audit --since): that stream's API only
        return {"publish": {"allow": _stream_read(RECORD_STREAM)},
                "subscribe": {"allow": [f"{subjects.DECISIONS_PREFIX}.>", f"{subjects.OBSERVATIONS_PREFIX}.>",
                                        f"{inbox_prefix(OBSERVER)}.>"]}}
    raise ValueError(f"unknown NATS user {user!r}; one of {', '.join(USERS)}")


@dataclass
class Tls:
    """Server side of TLS: certificate and key; ``ca`` verifies clients
    (mutual TLS) when ``verify`` is set."""

    cert: str
    key: str
    ca: str | None = None
    verify: bool = False


def server_config(passwords: Mapping[str, str], *, listen: str = "0.0.0.0:4222", store_dir: str | None = None,
                  tls: Tls | None = None, http_port: int | None = None,
                  cluster: ClusterMember | None = None) -> str:
    """A nats-server configuration: JetStream (when ``store_dir``), one user
    per entry of ``passwords`` with :func:`permissions`, a ``tls`` block, and
    a ``cluster`` block (``cluster``: this server's place in a cluster, its
    routes authenticated with their own user and password). Written as JSON,
    which nats-server's configuration format accepts."""
    users = []
    for user, password in passwords.items():
        if not password:
            raise ValueError(f"user {user!r}: empty password")
        users.append({"user": user, "password": password, "permissions": permissions(user)})
    conf: dict[str, Any] = {"listen": listen, "authorization": {"users": users}}
    if store_dir is not None:
        conf["jetstream"] = {"store_dir": store_dir}
    if http_port is not None:
        conf["http_port"] = http_port
    if cluster is not None:
        conf.update(cluster.config())
    if tls is not None:
        block: dict[str, Any] = {"cert_file": tls.cert, "key_file": tls.key}
        if tls.ca:
            block["ca_file"] = tls.ca
        if tls.verify:
            block["verify"] = True
        conf["tls"] = block
    return "# generated by python -m kinference_common.natsauth; contains passwords\n" + json.dumps(conf, indent=2) + "\n"


def generate_passwords(users: Sequence[str] = USERS) -> dict[str, str]:
    return {u: secrets.token_urlsafe(24) for u in users}


def write_private(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, a file created (or truncated) with mode
    0600: never readable by others, not even before a chmod."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def write_password_files(directory: Path, passwords: Mapping[str, str]) -> None:
    """``<directory>/<user>``, mode 0600: what ``--nats-password-file`` reads."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    for user, password in passwords.items():
        write_private(directory / user, password + "\n")


class LocalAuth:
    """``make run``'s NATS authentication: passwords generated into
    ``directory`` (one file per user, 0600) and a nats-server configuration
    next to them; :meth:`flags` are a service's command-line flags."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def server_config(self, listen: str, store_dir: str, *, cluster: ClusterMember | None = None,
                      http_port: int | None = None) -> Path:
        """Write (passwords kept if present) and return the configuration
        file; with ``cluster``, one file per member (``nats-<n>.conf``)."""
        passwords = {}
        for user in USERS:
            path = self.directory / user
            passwords[user] = path.read_text().strip() if path.exists() else secrets.token_urlsafe(24)
        write_password_files(self.directory, passwords)
        name = f"{cluster.server_name}.conf" if cluster is not None else "nats-server.conf"
        conf = self.directory / name
        write_private(conf, server_config(passwords, listen=listen, store_dir=store_dir, cluster=cluster,
                                          http_port=http_port))
        return conf

    def route_password(self) -> str:
        """The cluster routes' password (``<directory>/cluster-route``, made once)."""
        path = self.directory / "cluster-route"
        if not path.exists():
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            write_private(path, secrets.token_hex(24) + "\n")
        return path.read_text().strip()

    def flags(self, user: str) -> list[str]:
        return ["--nats-user", user, "--nats-password-file", str(self.directory / user)]


# ------------------------------------------------------------------ clients


def add_arguments(parser: argparse.ArgumentParser, default_user: str | None = None) -> None:
    """The NATS credential flags every service takes."""
    g = parser.add_argument_group("NATS authentication")
    g.add_argument("--nats-user", default=os.environ.get("KINFERENCE_NATS_USER", default_user), metavar="USER",
                   help="NATS user (env KINFERENCE_NATS_USER); without a password no credentials are sent")
    g.add_argument("--nats-password-file", type=Path, metavar="FILE",
                   help=f"file holding the user's password (or env {PASSWORD_ENV})")
    g.add_argument("--nats-tls-ca", type=Path, metavar="FILE", help="CA bundle to verify the NATS server (TLS on)")
    g.add_argument("--nats-tls-cert", type=Path, metavar="FILE", help="client certificate (mutual TLS)")
    g.add_argument("--nats-tls-key", type=Path, metavar="FILE", help="client key (mutual TLS)")


class CredentialsError(ValueError):
    """A credential flag is unusable; the message says which and why."""


def connect_options(args: argparse.Namespace) -> dict[str, Any]:
    """``nats.connect`` keyword arguments from :func:`add_arguments`' flags.
    Raises :class:`CredentialsError` naming the flag or file at fault."""
    opts: dict[str, Any] = {}
    password = None
    pw_file = getattr(args, "nats_password_file", None)
    if pw_file is not None:
        try:
            password = Path(pw_file).read_text().strip()
        except OSError as exc:
            raise CredentialsError(f"--nats-password-file {pw_file}: {exc.strerror or exc}") from None
        if not password:
            raise CredentialsError(f"--nats-password-file {pw_file}: the file is empty")
    elif os.environ.get(PASSWORD_ENV):
        password = os.environ[PASSWORD_ENV].strip()
    user = getattr(args, "nats_user", None)
    if password is not None:
        if not user:
            raise CredentialsError("a NATS password was given but no --nats-user")
        opts["user"], opts["password"] = user, password
        opts["inbox_prefix"] = inbox_prefix(user)
    ca, cert, key = (getattr(args, f"nats_tls_{n}", None) for n in ("ca", "cert", "key"))
    if (cert is None) != (key is None):
        raise CredentialsError("--nats-tls-cert and --nats-tls-key go together")
    if ca is not None or cert is not None:
        try:
            ctx = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
            if cert is not None:
                ctx.load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as exc:
            raise CredentialsError(f"NATS TLS files: {exc}") from None
        opts["tls"] = ctx
    return opts


# ---------------------------------------------------------------------- CLI


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m kinference_common.natsauth",
        description="Write a nats-server configuration with one user per Kinference service "
                    f"({', '.join(USERS)}), each allowed only the subjects it uses.",
    )
    p.add_argument("--out", type=Path, required=True, help="the nats-server configuration file to write")
    p.add_argument("--password-dir", type=Path, required=True,
                   help="<dir>/<user> password files: read when present, else generated and written (0600)")
    p.add_argument("--listen", default="0.0.0.0:4222", help="host:port (default %(default)s)")
    p.add_argument("--store-dir", help="JetStream storage directory (JetStream on)")
    p.add_argument("--tls-cert", help="server certificate (TLS on)")
    p.add_argument("--tls-key", help="server key")
    p.add_argument("--tls-ca", help="CA that signs client certificates")
    p.add_argument("--tls-verify", action="store_true", help="require client certificates (mutual TLS)")
    p.add_argument("--no-observer", action="store_true", help="no read-only observer user")
    a = p.parse_args(argv)
    if (a.tls_cert is None) != (a.tls_key is None):
        print("natsauth: --tls-cert and --tls-key go together", file=sys.stderr)
        return 1
    users = SERVICES if a.no_observer else USERS
    passwords: dict[str, str] = {}
    fresh: dict[str, str] = {}
    for user in users:
        path = a.password_dir / user
        if path.exists():
            passwords[user] = path.read_text().strip()
        else:
            passwords[user] = fresh[user] = secrets.token_urlsafe(24)
    if fresh:
        write_password_files(a.password_dir, fresh)
    tls = Tls(a.tls_cert, a.tls_key, a.tls_ca, a.tls_verify) if a.tls_cert else None
    try:
        text = server_config(passwords, listen=a.listen, store_dir=a.store_dir, tls=tls)
    except ValueError as exc:
        print(f"natsauth: {exc}", file=sys.stderr)
        return 1
    a.out.parent.mkdir(parents=True, exist_ok=True)
    # atomically (a server starting meanwhile reads the old file or the new
    # one, never half of one: compose under Podman re-runs this step each time
    # a dependent starts) and 0600 from the start
    tmp = a.out.with_name(f".{a.out.name}.tmp")
    write_private(tmp, text)
    os.replace(tmp, a.out)
    print(f"wrote {a.out} ({len(users)} users; passwords in {a.password_dir})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
