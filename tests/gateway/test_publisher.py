"""Publications from synchronous code: in posting order, without waiting for each, failures logged."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import Future

import pytest

from gateway import publisher


@pytest.fixture
def loop():
    """A loop of its own standing in for the gateway's (``publisher`` uses the process's main loop)."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield loop
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


@pytest.fixture
def on_loop(monkeypatch, loop):
    monkeypatch.setattr(publisher, "_layer_loop", lambda: loop)
    return loop


def test_posts_run_in_posting_order_even_when_an_earlier_one_is_slow(on_loop):
    sent: list[int] = []

    def publication(n: int, delay: float):
        async def make() -> int:
            await asyncio.sleep(delay)
            sent.append(n)
            return n

        return make

    futures = [publisher.post(publication(n, 0.05 if n == 0 else 0.0), what=f"event {n}") for n in range(20)]

    assert futures[-1].result(5) == 19  # waiting on the last waits for all before it
    assert sent == list(range(20))
    assert all(future.done() for future in futures)


def test_posting_does_not_wait_for_the_publication(on_loop):
    release = threading.Event()

    async def held() -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 5)

    future = publisher.post(held, what="a held event")
    assert not future.done()  # post returned while the publication still waits
    release.set()
    future.result(5)


def test_posts_from_many_threads_keep_each_threads_order(on_loop):
    sent: list[tuple[int, int]] = []

    def post_from(thread_no: int) -> Future:
        last = None
        for n in range(50):

            async def make(n: int = n) -> None:
                sent.append((thread_no, n))

            last = publisher.post(make, what="event")
        return last

    results: list[Future] = []
    threads = [threading.Thread(target=lambda t=t: results.append(post_from(t))) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for future in results:
        future.result(5)
    for thread_no in range(4):
        assert [n for t, n in sent if t == thread_no] == list(range(50))


def test_a_failing_publication_is_logged_and_does_not_stop_the_next(on_loop, caplog):
    sent: list[str] = []

    async def failing() -> None:
        raise ConnectionError("layer down")

    async def fine() -> None:
        sent.append("fine")

    failed = publisher.post(failing, what="chat to conn-1")
    publisher.post(fine, what="agent").result(5)

    assert isinstance(failed.exception(5), ConnectionError)
    assert sent == ["fine"]
    assert "failed to publish chat to conn-1" in caplog.text


def test_a_closed_loop_fails_the_publication_instead_of_raising_into_the_service(monkeypatch, caplog):
    closed = asyncio.new_event_loop()
    closed.close()
    monkeypatch.setattr(publisher, "_layer_loop", lambda: closed)

    async def never() -> None:
        raise AssertionError("must not run")

    future = publisher.post(never, what="sessions.changed")

    assert isinstance(future.exception(1), RuntimeError)
    assert "failed to publish sessions.changed" in caplog.text


def test_past_the_lane_limit_a_poster_waits_for_its_own_publication(on_loop, monkeypatch):
    monkeypatch.setattr(publisher, "LANE_LIMIT", 2)
    release = threading.Event()

    async def held() -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 5)

    async def quick() -> None:
        pass

    first, second = publisher.post(held, what="held"), publisher.post(quick, what="quick")
    assert not first.done() and not second.done()
    threading.Timer(0.2, release.set).start()
    third = publisher.post(quick, what="over the limit")  # returns only once it went out

    assert third.done() and first.done() and second.done()


def test_a_poster_past_the_limit_whose_lane_stays_stuck_goes_on_without_an_error(on_loop, monkeypatch):
    monkeypatch.setattr(publisher, "LANE_LIMIT", 1)
    monkeypatch.setattr(publisher, "PUBLISH_TIMEOUT_S", 0.2)
    release = threading.Event()

    async def held() -> None:
        await asyncio.get_running_loop().run_in_executor(None, release.wait, 5)

    publisher.post(held, what="held")
    stuck = publisher.post(held, what="behind it")  # waits 0.2 s, then returns instead of raising

    assert not stuck.done()
    release.set()
    stuck.result(5)
