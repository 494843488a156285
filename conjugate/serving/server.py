"""Running the HTTP app (serving/http.py): its listening socket, and uvicorn stopped the way a server
of requests in flight should be."""
from __future__ import annotations

import contextlib
import signal
import socket
import threading

import uvicorn

from conjugate.serving.decoder import GenerationError


class Server(uvicorn.Server):
    """uvicorn's server, stopped by SIGINT or SIGTERM in our way: `on_stop` runs at once (on a thread of
    its own: a signal handler must not wait on the engine's lock), so open streams end as cancelled
    instead of running out the grace period; and the signal is not raised again once the server has
    stopped, so the engine closes and the command returns."""

    def __init__(self, app, on_stop):
        super().__init__(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5))
        self.stopping = threading.Thread(target=on_stop, name="conjugate-serve-stop", daemon=True)

    def handle_exit(self, sig, frame) -> None:
        super().handle_exit(sig, frame)
        if self.stopping.ident is None:
            self.stopping.start()

    def stopped(self) -> None:
        """Wait for `on_stop` where a signal started it."""
        if self.stopping.ident is not None:
            self.stopping.join()

    @contextlib.contextmanager
    def capture_signals(self):
        handled = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in handled}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port, or GenerationError naming the address (a taken port is refused
    before any model loads, not after minutes of compiling)."""
    sock = None
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        if sock is not None:
            sock.close()
        raise GenerationError(f"--host/--port: cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock
