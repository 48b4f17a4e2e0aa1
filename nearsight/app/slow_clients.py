"""A time limit for a request's headers. uvicorn (under Gradio) bounds idle keep-alive
connections but not a client that sends its headers slowly (slowloris): such a connection
would hold a slot for as long as the client likes. :func:`install_header_timeout` wraps
uvicorn's HTTP protocol classes once per process: a connection whose first request's headers
have not all arrived ``seconds`` after it opened is closed. Later requests on a kept-alive
connection are bounded by uvicorn's own keep-alive timeout until they start."""

from __future__ import annotations

DEFAULT_HEADER_TIMEOUT_S = 10.0
_SETTING = {"seconds": DEFAULT_HEADER_TIMEOUT_S}


def install_header_timeout(seconds: float = DEFAULT_HEADER_TIMEOUT_S) -> None:
    _SETTING["seconds"] = seconds
    for protocol in _protocol_classes():
        if getattr(protocol, "_nearsight_header_timeout", False):
            continue
        protocol.connection_made = _timed_connection_made(protocol.connection_made)
        protocol.data_received = _timed_data_received(protocol.data_received)
        protocol._nearsight_header_timeout = True


def _protocol_classes() -> list[type]:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    classes: list[type] = [H11Protocol]
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:  # httptools is optional
        pass
    else:
        classes.append(HttpToolsProtocol)
    return classes


def _timed_connection_made(original):
    def connection_made(self, transport) -> None:
        original(self, transport)
        seconds = _SETTING["seconds"]
        if seconds and seconds > 0:
            self._nearsight_header_timer = self.loop.call_later(seconds, _close_if_no_request, self)

    return connection_made


def _timed_data_received(original):
    def data_received(self, data: bytes) -> None:
        original(self, data)
        timer = getattr(self, "_nearsight_header_timer", None)
        if timer is not None and getattr(self, "cycle", None) is not None:  # headers complete
            timer.cancel()
            self._nearsight_header_timer = None

    return data_received


def _close_if_no_request(protocol) -> None:
    if getattr(protocol, "cycle", None) is None and not protocol.transport.is_closing():
        protocol.transport.close()
