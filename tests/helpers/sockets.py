"""Raw sockets for the attack tests: a connection from a chosen loopback address, one whole
response read, whether the server closes a connection in time."""

from __future__ import annotations

import select
import socket
from urllib.parse import urlsplit


def address_of(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname, parts.port


def read_response(sock: socket.socket) -> bytes:
    """One whole response with a Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.lower().split(b"\r\n")
    length = next(int(line.split(b":")[1]) for line in lines if line.startswith(b"content-length"))
    while len(body) < length:
        body += sock.recv(65536)
    return head


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the server closes ``sock`` within ``seconds`` (nothing more is sent)."""
    ready, _, _ = select.select([sock], [], [], seconds)
    if not ready:
        return False
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def connect_from(source: str, address: tuple[str, int]) -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(10)
    sock.connect(address)
    return sock
