"""The local stack's NATS servers and credentials, found by kinfctl itself.

``make run`` (``services/simulators/stack.py``) writes one password file per
NATS user into ``.run/nats-auth/`` (``.run-<offset>/nats-auth/`` under
``KINFERENCE_PORT_OFFSET``), next to the configuration of each NATS server
it runs: ``nats-server.conf``, or ``nats-0.conf`` to ``nats-2.conf`` for
the cluster of three of ``make run-ha``. Without ``--nats-url`` kinfctl
connects to every server those name (:func:`stack_servers`; the stack's
directory is looked for in the current directory or any directory above
it). When no password is given (neither ``--nats-password-file`` nor the
environment's) and NATS is the local stack's (by default, or ``--nats-url``
naming servers of a stack found there, :func:`stack_of`), kinfctl reads the
user's file from that stack's ``nats-auth/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

from kinference_common import natsauth


def run_dir_name(offset: int) -> str:
    return f".run-{offset}" if offset else ".run"


def find_run_dir(offset: int, start: Path | None = None) -> Path | None:
    """``<dir>/.run[-offset]`` holding ``nats-auth/``, in ``start`` (the
    current directory) or above it."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / run_dir_name(offset)
        if _is_dir(candidate / "nats-auth"):
            return candidate
    return None


def stack_servers(run_dir: Path) -> list[str]:
    """The client URLs of the NATS servers the stack of ``run_dir`` runs, in
    order: the ``listen`` address of ``nats-auth/nats-<n>.conf`` (a cluster,
    ``make run-ha``), else of ``nats-auth/nats-server.conf``; none when
    neither is there or readable."""
    auth = run_dir / "nats-auth"
    members = sorted((int(m.group(1)), p) for p in auth.glob("nats-*.conf")
                     if (m := re.fullmatch(r"nats-(\d+)\.conf", p.name)))
    confs = [p for _, p in members] or [auth / "nats-server.conf"]
    urls = []
    for conf in confs:
        listen = _listen(conf)
        if listen is not None:
            urls.append(f"nats://{listen}")
    return urls


def _listen(conf: Path) -> str | None:
    """``host:port`` of a configuration make run wrote (JSON after a comment
    line); a wildcard host as 127.0.0.1. Only ``listen`` is read."""
    try:
        text = "\n".join(line for line in conf.read_text().splitlines() if not line.lstrip().startswith("#"))
        listen = json.loads(text).get("listen")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(listen, str) or ":" not in listen:
        return None
    host, _, port = listen.rpartition(":")
    return f"{'127.0.0.1' if host in ('', '0.0.0.0', '[::]') else host}:{port}"


def stack_of(urls: list[str], offset: int, start: Path | None = None) -> Path | None:
    """The local stack whose NATS servers include every one of ``urls``: that
    of the port offset first, else any ``.run*`` directory (in ``start`` or
    above) holding ``nats-auth/``; None when they are no local stack's."""
    want = {_address(u) for u in urls}
    first = find_run_dir(offset, start)
    candidates = [first] if first is not None else []
    candidates += _stack_dirs(start)
    for run in candidates:
        if want <= {_address(u) for u in stack_servers(run)}:
            return run
    return None


def _address(url: str) -> tuple[str, int]:
    """(host, port) of a server URL, ``localhost`` as the stack's 127.0.0.1."""
    parsed = urlsplit(url if "://" in url else f"nats://{url}")
    host = (parsed.hostname or "").lower()
    try:
        port = parsed.port or 4222
    except ValueError:
        port = -1
    return ("127.0.0.1" if host == "localhost" else host), port


def fill_credentials(args: argparse.Namespace, run_dir: Path | None) -> Path | None:
    """Sets ``args.nats_password_file`` to the file of ``args.nats_user`` in
    the stack ``run_dir``'s ``nats-auth/`` when no password was given;
    returns the file used."""
    if run_dir is None:
        return None
    if getattr(args, "nats_password_file", None) is not None or os.environ.get(natsauth.PASSWORD_ENV):
        return None
    user = getattr(args, "nats_user", None)
    if not user:
        return None
    found = run_dir / "nats-auth" / user
    if not found.is_file():
        return None
    args.nats_password_file = found
    return found


def why_unreachable(args: argparse.Namespace, offset: int, exc: BaseException, last: BaseException | None) -> str:
    """The message for a NATS connection that failed: a refused credential
    named as such (NATS is up), else that NATS cannot be reached."""
    text = f"{last or ''} {exc or ''}".lower()
    refused = "authorization" in text or "authentication" in text or "permissions" in text
    if not refused and getattr(args, "nats_password_file", None) is None \
            and not os.environ.get(natsauth.PASSWORD_ENV) and _listening(args.nats_url):
        refused = True  # NATS answers on its port, and no password was sent: the missing credential
    if refused:
        user = getattr(args, "nats_user", None) or "(none)"
        pw = getattr(args, "nats_password_file", None)
        if pw is None and not os.environ.get(natsauth.PASSWORD_ENV):
            return (f"NATS at {args.nats_url} is up but refused user {user!r}: no password was given and none "
                    f"was found in {run_dir_name(offset)}/nats-auth/{user} (pass --nats-password-file FILE, "
                    f"or run kinfctl from the directory where the stack was started)")
        return f"NATS at {args.nats_url} is up but refused user {user!r} with the password of {pw or 'the environment'}"
    return f"cannot reach NATS at {args.nats_url}: {exc or type(exc).__name__}{other_stacks(offset)}"


def other_stacks(offset: int, start: Path | None = None) -> str:
    """A hint naming the stacks started here or above with another port
    offset (``.run-N`` holding ``nats-auth/``), or ``""``."""
    found: list[int] = []
    for p in _stack_dirs(start):
        m = re.fullmatch(r"\.run(?:-(-?\d+))?", p.name)
        if m is None:
            continue
        n = int(m.group(1) or 0)
        if p.name == run_dir_name(n) and n != offset and n not in found:  # .run-03 is no offset's directory
            found.append(n)
    if not found:
        return ""
    named = ", ".join(f"{run_dir_name(n)}/ (--port-offset {n})" for n in found)
    return f"; a stack was started with another port offset: {named}"


def _stack_dirs(start: Path | None = None) -> list[Path]:
    """Every ``.run*`` directory holding ``nats-auth/`` in ``start`` (the
    current directory) or above it, nearest first."""
    here = (start or Path.cwd()).resolve()
    return [p for d in (here, *here.parents) for p in sorted(d.glob(".run*")) if _is_dir(p / "nats-auth")]


def _is_dir(path: Path) -> bool:
    """``path.is_dir()``, False where it cannot be looked into (another user's stack)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _listening(url: str) -> bool:
    """Whether something accepts TCP connections at a nats:// URL (at one of
    them, for a comma-separated list of a cluster's servers)."""
    for one in url.split(","):
        parsed = urlsplit(one.strip())
        try:
            with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 4222), timeout=1.0):
                return True
        except OSError:
            continue
    return False
