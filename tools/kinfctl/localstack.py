"""The local stack's NATS credentials, found by kinfctl itself.

``make run`` (``services/simulators/stack.py``) writes one password file per
NATS user into ``.run/nats-auth/`` (``.run-<offset>/nats-auth/`` under
``KINFERENCE_PORT_OFFSET``). When no password is given (neither
``--nats-password-file`` nor the environment's) and NATS is the local stack's
default address, kinfctl reads the user's file from there: from the current
directory or any directory above it.
"""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path
from urllib.parse import urlsplit

from kinference_common import natsauth


def run_dir_name(offset: int) -> str:
    return f".run-{offset}" if offset else ".run"


def find_password_file(user: str, offset: int, start: Path | None = None) -> Path | None:
    """``<dir>/.run[-offset]/nats-auth/<user>`` in ``start`` or above it."""
    here = (start or Path.cwd()).resolve()
    for d in (here, *here.parents):
        candidate = d / run_dir_name(offset) / "nats-auth" / user
        if candidate.is_file():
            return candidate
    return None


def fill_credentials(args: argparse.Namespace, offset: int) -> Path | None:
    """Sets ``args.nats_password_file`` to the local stack's file for
    ``args.nats_user`` when no password was given; returns the file used."""
    if getattr(args, "nats_password_file", None) is not None or os.environ.get(natsauth.PASSWORD_ENV):
        return None
    user = getattr(args, "nats_user", None)
    if not user:
        return None
    found = find_password_file(user, offset)
    if found is not None:
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
    return f"cannot reach NATS at {args.nats_url}: {exc or type(exc).__name__}"


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
