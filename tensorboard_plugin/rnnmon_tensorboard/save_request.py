"""The checks of the tab's one write, `POST /thresholds`, before its body is read as a thresholds document.

A save takes JSON only (415), with a header a cross-site form cannot send (403), the version of the file it edits
(428 without), a small body (413), addressed to this machine from its own origin (403: DNS rebinding). Each
refusal's message says what to change.

Example:
    >>> check_host(request)
    >>> save_thresholds(json_body(request), edited_version(request))
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import urllib.parse
from typing import Any

from tensorboard import errors
from werkzeug import wrappers

VERSION_HEADER = "X-Rnnmon-Version"  # the `version` a save edits (GET /thresholds answers it)
SAVE_HEADER, SAVE_HEADER_VALUE = "X-Rnnmon-Request", "save"  # a cross-site form post cannot set a header
MAX_BODY_BYTES = 16 * 1024  # a thresholds document is under 2 KiB


class RequestRefused(errors.PublicError):
    """A refused `POST /thresholds`, with its HTTP status (405, 409, 413, 415, 428); the message says what to
    change."""

    def __init__(self, http_code: int, message: str, headers: list[tuple[str, str]] | None = None) -> None:
        super().__init__(message)
        self.http_code = http_code
        self.headers = headers or []


def edited_version(request: wrappers.Request) -> str:
    """The `version` of the thresholds a save edits, after the header check that keeps other sites out: every
    client must say it (428 without), so a save never overwrites a file it has not seen."""
    if request.headers.get(SAVE_HEADER, "").strip().lower() != SAVE_HEADER_VALUE:
        raise errors.PermissionDeniedError(
            f"POST /thresholds needs the header {SAVE_HEADER}: {SAVE_HEADER_VALUE} (a cross-site form cannot send it)")
    edits = request.headers.get(VERSION_HEADER, "").strip()
    if not edits:
        raise RequestRefused(428, f"POST /thresholds needs the header {VERSION_HEADER}: the version that GET "
                                  "/thresholds answered (\"none\" while there is no file), so that a save never "
                                  "overwrites changes it has not seen")
    return edits


def json_body(request: wrappers.Request) -> Any:
    """The JSON document of a save request, after the checks that keep large bodies out."""
    if request.mimetype != "application/json":
        raise RequestRefused(415, "POST /thresholds takes JSON: send Content-Type: application/json. "
                                  f"Received: {request.content_type or 'no Content-Type'}")
    too_large = f"The thresholds document must be at most {MAX_BODY_BYTES} bytes"
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise RequestRefused(413, f"{too_large}. Received: Content-Length {request.content_length}")
    body = request.stream.read(MAX_BODY_BYTES + 1)  # without a Content-Length (chunked), read one byte past the limit
    if len(body) > MAX_BODY_BYTES:
        raise RequestRefused(413, f"{too_large}. Received: a longer body, sent without Content-Length")
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as error:
        raise errors.InvalidArgumentError(f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise errors.InvalidArgumentError("the body is nested too deeply") from None


def check_host(request: wrappers.Request) -> None:
    """Refuse a save addressed to a foreign host name or sent from another origin (DNS rebinding), as Jupyter does.

    Allowed: localhost, IP literals, this machine's names, and the names in RNNMON_ALLOWED_HOSTS (comma
    separated; "*" allows any).
    """
    host = request.host or ""
    if host.startswith("["):  # [IPv6]:port
        name = host[1:host.find("]")] if "]" in host else host
    else:
        name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.rstrip(".").lower()
    allowed = {h.strip().lower() for h in os.environ.get("RNNMON_ALLOWED_HOSTS", "").split(",") if h.strip()}
    if not ("*" in allowed or name in allowed or _local_name(name)):
        raise errors.PermissionDeniedError(
            f"POST /thresholds refuses Host {host[:80]!r}: reach TensorBoard at localhost, an IP address or this "
            "machine's name, or list the name in RNNMON_ALLOWED_HOSTS (a guard against DNS rebinding)")
    origin = request.headers.get("Origin")
    if origin and origin != "null" and urllib.parse.urlsplit(origin).netloc.lower() != host.lower():
        raise errors.PermissionDeniedError(f"POST /thresholds refuses a request from another origin: {origin[:80]!r}")


def _local_name(name: str) -> bool:
    if name in ("localhost", socket.gethostname().lower(), socket.getfqdn().lower()) or name.endswith(".localhost"):
        return True
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True
