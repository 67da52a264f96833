"""Which host names are this machine's: the one place that decides what binding an address
keeps local (:func:`is_loopback`), and which ``Host`` a server without a token answers on a
loopback connection (:class:`HostNames`, what :class:`~tdreplay.service.security.BrowserGuard`
asks).

A web page in a browser on this host reaches a loopback server too. A page on a domain the
attacker points at 127.0.0.1 (DNS rebinding) is same-origin with the server it reaches, so
its ``Origin`` says nothing; its ``Host`` still names the attacker's domain. A server without
a token therefore answers only the names no other site can stand for:

* an IP address literal (a page served from it is the server's own origin, whose
  cross-site requests ``Origin`` / ``Sec-Fetch-Site`` already tell apart);
* ``localhost`` and ``*.localhost`` (browsers resolve them to loopback themselves, RFC 6761);
* this machine's own name (``socket.gethostname()``, which Debian maps to 127.0.1.1);
* the names the operator lists with ``--allow-host`` (a proxy on this host that forwards its
  own ``Host``; ``*`` lets every name through).

    >>> names = HostNames(["replay.internal"], machine="box")
    >>> [names.allows(h) for h in ("127.0.0.1:8000", "[::1]:8000", "localhost", "a.localhost:80",
    ...  "BOX:8000", "replay.internal", "evil.example:8000", "")]
    [True, True, True, True, True, True, False, False]
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

#: ``--allow-host`` value that lets every name through (the ``Host`` check off)
ANY_HOST = "*"
#: a name ``--allow-host`` takes (a DNS name; IP addresses are always answered)
_HOST_NAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?")


def check_host_names(names: list[str]) -> list[str]:
    """``names`` (``--allow-host``), each a host name or ``*``.

    Raises:
        ValueError: one is not, naming it.
    """
    for name in names:
        if name != ANY_HOST and not _HOST_NAME.fullmatch(name):
            raise ValueError(f"allow_host {name!r} is not a host name (letters, digits, '.', '-')")
    return names


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the server to this machine: 127.0.0.0/8, ::1, localhost.

    Any other name may resolve to a reachable interface, and ``0.0.0.0`` / ``::``
    are every interface, so they are not loopback.

        >>> [is_loopback(h) for h in ("127.0.0.1", "127.8.9.10", "::1", "localhost", "0.0.0.0", "::")]
        [True, True, True, True, False, False]
    """
    name = host.strip().removeprefix("[").removesuffix("]").lower()
    if name == "localhost":
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def host_name(host: str) -> str:
    """The name in a ``Host`` header, without its port, lower case (``[::1]:8000`` -> ``::1``)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    if host.count(":") > 1:  # a bare IPv6 address (not valid in Host, but unambiguous)
        return host
    return host.partition(":")[0].rstrip(".")


class HostNames:
    """The ``Host`` names a loopback server without a token answers (see the module doc).

    Args:
        allowed: the operator's ``--allow-host`` names (``*``: any name).
        machine: this machine's name (default ``socket.gethostname()``).
    """

    def __init__(self, allowed: Iterable[str] = (), machine: str | None = None) -> None:
        self.allowed = frozenset(host_name(a) for a in allowed)
        self.machine = host_name(socket.gethostname() if machine is None else machine)

    def allows(self, host: str) -> bool:
        """Whether a request with this ``Host`` header may be served."""
        name = host_name(host)
        if not name:
            return False
        if ANY_HOST in self.allowed or name in self.allowed or name == self.machine:
            return True
        if name == "localhost" or name.endswith(".localhost"):
            return True
        try:
            ipaddress.ip_address(name)
        except ValueError:
            return False
        return True
