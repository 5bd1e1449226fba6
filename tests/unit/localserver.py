"""An aiohttp application served on a free loopback port, for unit tests that talk to a small
in-process stand-in for the API server through the operator's real client."""

from __future__ import annotations

from aiohttp import web


class LocalServer:
    """Subclasses add their routes to ``self.app`` in ``__init__`` (after calling this one); the
    test awaits :meth:`start` for the base URL and ``self.runner.cleanup()`` at the end."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.runner = web.AppRunner(self.app)

    async def start(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
