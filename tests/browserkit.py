"""A headless Chromium that cannot reach beyond this host, for every browser test.

Started without flags, Chromium goes online by itself (component updates,
field trials, network time, account sign-in, Google's DNS names), and with
``--disable-background-networking`` and ``--disable-component-update`` too
(Chromium 156: the component updater, network time and accounts.google.com
still called). :func:`host_only_browser` starts the OS's Chromium with its
background networking off, the Google service URLs it calls anyway pointed
at a closed port on loopback, and every request that is not for loopback
sent to a *dead proxy*: a listener on 127.0.0.1 that records each
connection and closes it. Loopback bypasses a
proxy in Chromium, so the page under test loads directly; anything else
lands on the dead proxy, and :class:`DeadProxy` lets the test assert that
nothing did. DNS is closed as well (``--host-resolver-rules``): only loopback
names resolve.

    >>> with host_only_browser(playwright_api) as (browser, proxy):  # doctest: +SKIP
    ...     page = browser.new_page(); page.goto(server.url + "/status")
    >>> assert proxy.attempts == []  # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import threading
from collections.abc import Iterator
from typing import Any

CHROMIUM = next(
    (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
)

#: what keeps Chromium from calling home on its own
QUIET = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-client-side-phishing-detection",
    "--disable-breakpad",
    "--disable-field-trial-config",
    "--disable-features=OptimizationHints,MediaRouter,Translate,AutofillServerCommunication,"
    "NetworkTimeServiceQuerying,CertificateTransparencyComponentUpdater,DialMediaRouteProvider",
    "--metrics-recording-only",
    "--no-first-run",
    "--no-default-browser-check",
    "--no-pings",
    "--disable-quic",
]


#: the Google services Chromium 15x calls even so (the component updater, account sign-in),
#: pointed at a closed port on loopback: ``{closed}`` is filled in
SERVICES = [
    "--component-updater=disable-background-downloads,url-source=http://127.0.0.1:{closed}",
    "--gaia-url=http://127.0.0.1:{closed}",
    "--lso-url=http://127.0.0.1:{closed}",
    "--google-apis-url=http://127.0.0.1:{closed}",
    "--google-url=http://127.0.0.1:{closed}",
]


class DeadProxy:
    """A listener on loopback that takes connections, remembers what they asked, and closes
    them; and a port on loopback that is bound but never listens (``closed``: refused)."""

    def __init__(self) -> None:
        self.reserved = socket.socket()
        self.reserved.bind(("127.0.0.1", 0))
        self.closed = self.reserved.getsockname()[1]
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.attempts: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            with conn:
                conn.settimeout(1.0)
                with contextlib.suppress(OSError):
                    first = conn.recv(4096).split(b"\r\n", 1)[0]
                    self.attempts.append(first.decode("latin-1") or "(connected, sent nothing)")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        self.reserved.close()


@contextlib.contextmanager
def host_only_browser(api: Any) -> Iterator[tuple[Any, DeadProxy]]:
    """Chromium (Playwright's ``p.chromium`` of ``api``) that can reach loopback only."""
    assert CHROMIUM is not None
    proxy = DeadProxy()
    args = [
        *QUIET,
        *(flag.format(closed=proxy.closed) for flag in SERVICES),
        f"--proxy-server=http://127.0.0.1:{proxy.port}",
        "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
    ]
    browser = api.chromium.launch(executable_path=CHROMIUM, args=args)
    try:
        yield browser, proxy
    finally:
        browser.close()
        proxy.close()
