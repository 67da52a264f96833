"""An async request that fails mid-body sends no more of it: its parts view the caller's tensors.

An extend's body is a tuple of views of its columns (``codec.parts``). From
Python 3.12 asyncio's socket transport queues what it cannot send at once
*uncopied*, and ``transport.close()`` goes on flushing the queue. After a
timed-out or cancelled extend, the caller may change its tensors (a writer
refills its columns) while the old request's body still goes out under its
request id: the server would store rows nobody sent. A failed connection is
aborted instead, its queue dropped.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import torch

from tdreplay.client import errors
from tdreplay.client.aio_transport import AsyncTransport
from tdreplay.client.commands import Extend
from tdreplay.client.settings import ClientSettings

BODY = 64 << 20  # far more than the kernel's socket buffers hold


def test_a_timed_out_request_stops_sending_its_body() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    timed_out = threading.Event()
    received: list[int] = []

    def server() -> None:  # reads nothing until the client gave up, then all it gets
        conn, _ = listener.accept()
        with conn:
            timed_out.wait(30)
            time.sleep(0.2)
            conn.settimeout(5)
            n = 0
            try:
                while data := conn.recv(1 << 20):
                    n += len(data)
            except OSError:
                pass
            received.append(n)

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    req = Extend("t", {"obs": torch.zeros(BODY // 4096, 4096, dtype=torch.uint8)}).request()

    async def main() -> None:
        url = f"http://127.0.0.1:{port}"
        transport = AsyncTransport(url, ClientSettings((url,), timeout=0.5))
        with pytest.raises(errors.Timeout):
            await transport.execute(req)
        timed_out.set()
        await asyncio.sleep(1.0)  # a closing transport would flush its queue meanwhile

    try:
        asyncio.run(main())
        thread.join(10)
    finally:
        listener.close()
    assert received and received[0] < req.nbytes // 2
