"""A TCP proxy a test can cut and restore: a dependency (PostgreSQL, Redis) going away and coming back for the
processes that reach it through the proxy, without stopping the shared server itself.

    with TcpProxy("127.0.0.1", 5432) as proxy:       # listens on 127.0.0.1:proxy.port
        ... point a process at proxy.port ...
        proxy.cut()       # open connections are closed, new ones closed as soon as they arrive
        proxy.restore()   # new connections reach the server again

Its own event loop runs on a thread, so the test's code stays synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from concurrent.futures import Future

CHUNK = 64 * 1024


class TcpProxy:
    def __init__(self, target_host: str, target_port: int):
        self.target = (target_host, target_port)
        self.port = 0
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tcp-proxy", daemon=True)
        self.server: asyncio.Server | None = None
        self.open: set[asyncio.StreamWriter] = set()
        self.is_cut = False
        self.accepted = 0

    def __enter__(self) -> TcpProxy:
        self.thread.start()
        self.server = self.call(self.listen())
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    def __exit__(self, *exc_info) -> None:
        self.call(self.shutdown())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()

    def call(self, coroutine):
        future: Future = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout=10)

    def cut(self) -> None:
        self.call(self.cut_now())

    def restore(self) -> None:
        self.call(self.restore_now())

    async def listen(self) -> asyncio.Server:
        return await asyncio.start_server(self.accept, "127.0.0.1", 0)

    async def cut_now(self) -> None:
        self.is_cut = True
        for writer in list(self.open):
            writer.close()
        self.open.clear()

    async def restore_now(self) -> None:
        self.is_cut = False

    async def shutdown(self) -> None:
        await self.cut_now()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.is_cut:
            client_writer.close()
            return
        try:
            server_reader, server_writer = await asyncio.open_connection(*self.target)
        except OSError:
            client_writer.close()
            return
        self.open.update((client_writer, server_writer))
        await asyncio.gather(
            self.pipe(client_reader, server_writer, client_writer),
            self.pipe(server_reader, client_writer, server_writer),
        )

    async def pipe(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, other: asyncio.StreamWriter
    ) -> None:
        """One direction; when it ends (either side closed, or the proxy was cut) both sides are closed."""
        try:
            while data := await reader.read(CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            for side in (writer, other):
                side.close()
                self.open.discard(side)
                with contextlib.suppress(ConnectionError, OSError):
                    await side.wait_closed()
