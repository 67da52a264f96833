"""Polling on the same-host socket (``--shm-poll-us``, ``shm_poll_us``): a client calling in a
tight loop is polled instead of woken, a client that pauses costs no polling, and polling
never holds the server from its other clients.

The server's polls are read from its metrics (``tdreplay_shm_polls_total``), whether the
client's thread slept from the kernel (``voluntary_ctxt_switches`` in
``/proc/<pid>/task/<tid>/status``: a thread that sleeps in the kernel counts one each time);
none of it from timings of the calls.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Any

import pytest
from test_shm import spec
from test_shm_attacks import _recv_reply, raw, read
from testkit import rows

from tdreplay.client import ReplayClient
from tdreplay.client.settings import ClientSettings
from tdreplay.client.shm import background_thread
from tdreplay.codec.shm import HEADER, sample_frame
from tdreplay.system import Poller, cpu_to_spare, poll

pytestmark = pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="needs memfd_create")

#: a window wide enough that a loaded machine still answers within it
WIDE = 20_000


def sleeps(pid: int, tid: int) -> int:
    """How often thread ``tid`` of process ``pid`` slept in the kernel so far."""
    with open(f"/proc/{pid}/task/{tid}/status") as f:
        return next(
            int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches")
        )


def polls(server: Any) -> dict[str, float]:
    """The server's polling metrics: found, missed, seconds."""
    text = server.request("GET", "/metrics")[2].decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tdreplay_shm_polls_total{"):
            out[line.split('outcome="')[1].split('"')[0]] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("tdreplay_shm_poll_seconds_total "):
            out["seconds"] = float(line.rsplit(" ", 1)[1])
    return out


def filled(server: Any, name: str) -> None:
    with ReplayClient(server.url, transport="http") as c:
        c.create_table(spec(name, {"kind": "uniform"}, capacity=64))
        c.extend(name, rows(0, 64))


def tight_loop(server: Any, poll_us: int, calls: int) -> tuple[dict[str, float], float]:
    """``calls`` one-item samples in a tight loop by a client polling ``poll_us``: the server's
    polls meanwhile, and how often the calling thread slept per call."""
    seen = []
    with ReplayClient(server.url, transport="shm", shm_poll_us=poll_us) as c:
        for _ in range(20):
            c.sample("t", 1)
        me = threading.get_native_id()
        before, slept = polls(server), sleeps(os.getpid(), me)
        for _ in range(calls):
            c.sample("t", 1)
            seen.append(cpu_to_spare())
        slept, after = sleeps(os.getpid(), me) - slept, polls(server)
    if poll_us:
        spare_or_skip(seen)
    return {k: after[k] - before[k] for k in after}, slept / calls


def spare_or_skip(seen: list[bool]) -> None:
    """Skip the rest of a test about polling happening when the machine had no CPU to spare
    for most of it (``seen``: :func:`cpu_to_spare` during it): polling is then rightly off
    (:func:`test_no_polling_while_the_machine_has_no_cpu_to_spare`)."""
    if sum(seen) < len(seen) / 2:
        pytest.skip("the machine had no CPU to spare: no polling, as it should")


def raw_loop(server: Any, calls: int) -> dict[str, float]:
    """``calls`` one-item samples on a bare socket, each sent as soon as the last answer
    came (no decoding between): the server's polls meanwhile."""
    request = sample_frame("t", slot=0, batch_size=1, timeout=0)
    seen = []
    with raw(server) as s:
        before = polls(server)
        for _ in range(calls):
            s.sendall(request)
            reply, fds = _recv_reply(s)
            for fd in fds:
                os.close(fd)
            assert reply["ok"] is True
            seen.append(cpu_to_spare())
        after = polls(server)
    spare_or_skip(seen)
    return {k: after[k] - before[k] for k in after}


def test_a_tight_loop_is_polled_on_both_ends_not_woken(live_server: Any) -> None:
    polled = live_server(shm_poll_us=WIDE)
    filled(polled, "t")
    woken = live_server(shm_poll_us=0)  # the same calls, polling off on both ends
    filled(woken, "t")
    off, client_off = tight_loop(woken, 0, 300)
    assert off == {"found": 0, "missed": 0, "seconds": 0}, off
    # requests of a bare loop come while the server polls (at most a millisecond at a
    # time; while the machine has a CPU to spare)
    found = raw_loop(polled, 300)
    assert found["found"] > 0 and found["seconds"] > 0, found
    # the polling thread slept for few answers, the other for most (fewer on a busy machine,
    # where the answer is sometimes there before the thread asks); up to three rounds:
    # another process taking the polling thread's CPU rightly pauses its polling a while
    for _ in range(3):
        server, client = tight_loop(polled, WIDE, 300)
        assert server["found"] + server["missed"] > 0, server
        if client < 0.5 * client_off:
            break
    assert client < 0.5 * client_off, (client, client_off)


def test_a_background_threads_calls_do_not_poll(live_server: Any) -> None:
    """A thread no caller waits on (a loader's fetcher, a writer's sender marks itself with
    ``background_thread``) sleeps for its answers: polling there would take the GIL from the
    threads doing the work."""
    server = live_server(shm_poll_us=WIDE)
    filled(server, "t")
    slept: dict[str, float] = {}
    polled: dict[str, int] = {}
    seen: list[bool] = []
    with ReplayClient(server.url, transport="shm", shm_poll_us=WIDE) as c:

        def calls(name: str) -> None:
            if name == "background":
                background_thread()
            for _ in range(20):
                c.sample("t", 1)
            me, poller = threading.get_native_id(), c._driver.link(0).channel()._poller
            before, polls = sleeps(os.getpid(), me), poller.polls
            for _ in range(300):
                c.sample("t", 1)
                if name == "polling":
                    seen.append(cpu_to_spare())
            slept[name] = (sleeps(os.getpid(), me) - before) / 300
            polled[name] = poller.polls - polls

        for name in ("background", "polling"):
            thread = threading.Thread(target=calls, args=(name,))
            thread.start()
            thread.join()
    assert polled["background"] == 0, (polled, slept)
    spare_or_skip(seen)
    # with a CPU to spare, an answer takes longer to come than the thread takes to ask
    assert polled["polling"] > 0 and slept["background"] > 0.5, (polled, slept)


def test_a_client_that_pauses_between_calls_costs_no_polling(live_server: Any) -> None:
    """The server polls only a connection whose client asked again within the window the
    last time: a client 30 ms apart with a 10 ms window is never polled."""
    server = live_server(shm_poll_us=10_000)
    filled(server, "t")
    with ReplayClient(server.url, transport="shm") as c:
        for _ in range(40):
            time.sleep(0.03)
            c.sample("t", 1)
    assert polls(server) == {"found": 0, "missed": 0, "seconds": 0}


def test_polling_holds_the_server_from_its_other_clients_at_most_briefly(
    live_server: Any,
) -> None:
    """With the widest window, a client calling in a tight loop on one thread would be
    served as long as it keeps calling; the server goes back to its other connections at
    least every millisecond (``--shm-poll-hold-us``), so HTTP calls and another thread's
    same-host calls are answered meanwhile."""
    server = live_server(shm_poll_us=100_000)
    filled(server, "t")
    stop = threading.Event()
    calls = [0]

    def tight() -> None:
        with ReplayClient(server.url, transport="shm", shm_poll_us=100_000) as c:
            while not stop.is_set():
                c.sample("t", 1)
                calls[0] += 1

    worker = threading.Thread(target=tight)
    worker.start()
    try:
        while calls[0] < 200:
            time.sleep(0.01)
        slowest, before = 0.0, calls[0]
        with ReplayClient(server.url, transport="http") as h, ReplayClient(server.url) as s:
            for _ in range(20):
                for call in (lambda: h.info("t"), lambda: s.sample("t", 4)):
                    began = time.perf_counter()
                    call()
                    slowest = max(slowest, time.perf_counter() - began)
        # the tight loop went on meanwhile (slowly: its thread polls for its answers in this
        # process, and so takes the GIL from the thread calling here)
        assert calls[0] > before
    finally:
        stop.set()
        worker.join()
    assert slowest < 0.5, slowest


def test_frames_split_garbled_or_cut_off_while_polled(live_server: Any) -> None:
    """A frame that comes in pieces within the window is read whole; garbage ends only its
    connection, with an answer; a client hanging up while polled frees its connection."""
    server = live_server(shm_poll_us=WIDE)
    filled(server, "t")
    with raw(server) as s:
        for _ in range(3):  # the second and third come soon: the server polls after them
            s.sendall(sample_frame("t", slot=0, batch_size=1, timeout=0))
            reply, fds = _recv_reply(s)
            for fd in fds:
                os.close(fd)
            assert reply["ok"] is True
        whole = sample_frame("t", slot=0, batch_size=2, timeout=0)
        s.sendall(whole[:3])
        time.sleep(0.002)
        s.sendall(whole[3 : HEADER.size + 2])
        time.sleep(0.002)
        s.sendall(whole[HEADER.size + 2 :])
        reply, fds = _recv_reply(s)
        for fd in fds:
            os.close(fd)
        assert reply["ok"] is True and reply["rows"] == 2
        s.sendall(sample_frame("t", slot=0, batch_size=1, timeout=0))
        reply, fds = _recv_reply(s)
        for fd in fds:
            os.close(fd)
        assert reply["ok"] is True
        s.sendall(HEADER.pack(0xFFFFFFFF) + b"\x01")  # soon, and no frame
        answer = read(s)
        assert answer["ok"] is False and answer["error"]["type"] == "InvalidRequest"
        assert s.recv(1) == b""  # the server ended the connection
    with raw(server) as s:
        for _ in range(3):
            s.sendall(sample_frame("t", slot=0, batch_size=1, timeout=0))
            for fd in _recv_reply(s)[1]:
                os.close(fd)
    with ReplayClient(server.url, transport="shm") as c:  # the server serves on
        assert c.sample("t", 3).batch_size[0] == 3
    log = server.log.read_text()
    assert "Traceback" not in log, log[-2000:]


def test_poll_reads_until_something_comes_or_the_time_is_up() -> None:
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        began = time.perf_counter()
        assert poll(lambda: a.recv(8), 0.01) is None
        assert time.perf_counter() - began >= 0.01
        threading.Timer(0.005, lambda: b.send(b"late")).start()
        assert poll(lambda: a.recv(8), 5.0) == b"late"
        b.close()
        assert poll(lambda: a.recv(8), 1.0) == b""  # the end is something


@pytest.mark.parametrize("bad", [-1, 100_001, 1.5, "200", True])
def test_a_clients_poll_window_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match="shm_poll_us"):
        ClientSettings(urls=("http://127.0.0.1:1",), shm_poll_us=bad)


@pytest.mark.parametrize(("hold", "least", "most"), [(None, 0.0, 0.02), (20_000, 0.015, 0.08)])
def test_a_missed_poll_holds_the_loop_no_longer_than_the_hold(
    live_server: Any, hold: int | None, least: float, most: float
) -> None:
    """A window wider than the hold (``--shm-poll-us`` up to 100 ms) is cut at the hold
    (``--shm-poll-hold-us``, 1 ms by default): a client that asks twice in a row and then
    pauses costs one poll of at most the hold, not one of the whole window, during which
    nothing else on the server ran."""
    server = live_server(shm_poll_us=100_000, **({"shm_poll_hold_us": hold} if hold else {}))
    filled(server, "t")
    with raw(server) as s:
        for _ in range(2):  # the second comes soon after the first answer: it is polled after
            s.sendall(sample_frame("t", slot=0, batch_size=1, timeout=0))
            reply, fds = _recv_reply(s)
            for fd in fds:
                os.close(fd)
            assert reply["ok"] is True
        time.sleep(0.3)  # the poll after the second answer misses
        got = polls(server)
    assert got["missed"] >= 1, got
    assert least <= got["seconds"] < most, got  # the window is 100 ms


@pytest.mark.parametrize("bad", [0, 9, 1_000_001, "1ms"])
def test_the_servers_poll_hold_is_checked(bad: Any) -> None:
    from pydantic import ValidationError

    from tdreplay.service.settings import Settings

    with pytest.raises(ValidationError, match="shm_poll_hold_us"):
        Settings(shm_poll_hold_us=bad)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 1, reason="needs CPU affinity")
def test_a_poller_pauses_when_its_thread_loses_the_cpu() -> None:
    """A poll that found its answer, but during which a busy process on the same CPU took
    most of the time, pauses polling (it would hold the CPU the answer needs); the same
    poll with the CPU to itself does not. A poll that finds nothing pauses it too."""
    import subprocess
    import sys

    cpu = min(os.sched_getaffinity(0))

    def poll_once(busy: bool) -> tuple[bool, float]:
        """Whether a poll of 30 ms pinned to ``cpu`` paused polling, and the share of it
        the thread spent off its CPU."""
        a, b = socket.socketpair()
        hog = None
        if busy:
            hog = subprocess.Popen(
                [sys.executable, "-c", "while True: pass"],
                preexec_fn=lambda: os.sched_setaffinity(0, {cpu}),
            )
            time.sleep(0.2)  # it runs
        mask = os.sched_getaffinity(0)
        try:
            with a, b:
                a.setblocking(False)
                timer = threading.Timer(0.03, lambda: b.send(b"x"))
                timer.start()  # before this thread is pinned: it runs anywhere
                os.sched_setaffinity(0, {cpu})
                poller = Poller(0.5, spare=lambda: True)  # the machine's load aside
                began, cpu_began = time.perf_counter(), time.thread_time()
                assert poller.read(lambda: a.recv(8)) == b"x"
                wall = time.perf_counter() - began
                off = 1 - (time.thread_time() - cpu_began) / wall
                timer.join()
                return poller.unpaid > 0, off
        finally:
            os.sched_setaffinity(0, mask)
            if hog is not None:
                hog.kill()
                hog.wait()

    assert poll_once(busy=True)[0] is True
    # alone on its CPU, it goes on polling; on a busy machine other tests' processes may
    # share the CPU, and a poll that lost it rightly pauses: up to ten tries, judged only
    # where the thread had its CPU for three quarters of the poll or more
    tries = [poll_once(busy=False) for _ in range(10)]
    alone = [paused for paused, off in tries if off < 0.25]
    if not alone:
        pytest.skip(f"other processes took the CPU in every poll: {tries}")
    assert not any(alone), tries


def test_a_pollers_pause_doubles_while_polls_do_not_pay() -> None:
    """A poll that finds nothing pauses polling for a millisecond, the next one in a row
    for two, and so on up to ``pause``; one that finds its answer ends the run: a passing
    hiccup costs a tight loop a millisecond of polling, a machine where polling never
    pays is polled a few times a second."""
    a, b = socket.socketpair()
    with a, b:
        a.setblocking(False)
        poller = Poller(0.0002, pause=0.016, spare=lambda: True)
        for unpaid, paused in enumerate((0.001, 0.002, 0.004, 0.008, 0.016, 0.016), 1):
            assert poller.read(lambda: a.recv(8)) is None
            left = poller.resume - time.perf_counter()
            assert poller.unpaid == unpaid and paused - 0.001 < left <= paused, (unpaid, left)
            assert not poller.ready()
            time.sleep(left)
            assert poller.ready()
        b.send(b"x")
        assert poller.read(lambda: a.recv(8)) == b"x" and poller.unpaid == 0 and poller.ready()
        assert poller.read(lambda: a.recv(8)) is None
        assert 0 < poller.resume - time.perf_counter() <= 0.001


def test_no_polling_while_the_machine_has_no_cpu_to_spare() -> None:
    """With more runnable threads than CPUs (busy processes, one more than the CPUs), a
    poller does not poll: it would take a CPU another thread needs."""
    import subprocess
    import sys

    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range((os.cpu_count() or 1) + 1)
    ]
    try:
        time.sleep(0.3)  # they run
        cpu_to_spare()  # one reading of more runnable threads than CPUs: may be passing
        time.sleep(0.02)
        assert not cpu_to_spare()  # two in a row
        assert not Poller(0.001).ready()
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
