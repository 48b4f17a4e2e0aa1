"""One admission model (issue 51, items 3, 5 and 6): a client is its named key's holder, else
its address's network (/24 for IPv4, /64 for IPv6); every shared pool (sign-in slots,
connections, upload space, decodes, plain and heavy searches, the page's searches) gives each
identity a share; an identity with nothing in flight goes first.

Before: 3 addresses x 32 trickling connections filled the 64 sign-in slots (a browser with
the right key got 503 15 times of 15); fair shares were per address, so 48 or 80 addresses of
one attacker took them all; plain searches had no share at all."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
from helpers import address_of, connect_from, running_page

from nearsight.app.serve.clients import network_of
from nearsight.app.serve.gates import WorkGate

KEY = "k" * 24
SIGN_IN_HEAD = (b"POST /login HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 400\r\n"
                b"Content-Type: application/x-www-form-urlencoded\r\n\r\nkey=")  # fmt: skip


@pytest.mark.parametrize(("address", "network"), [
    ("203.0.113.7", "203.0.113.0/24"), ("127.0.4.9", "127.0.4.0/24"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"), ("key:alice", "key:alice"), ("", ""),
])  # fmt: skip
def test_an_address_counts_as_its_network(address, network):
    assert network_of(address) == network


def test_trickled_sign_ins_from_three_networks_leave_a_slot_for_a_fourth(onnx_gallery):
    """Three addresses x 32 connections trickle sign-in forms: each network is read at most an
    eighth of the 64 slots at once (the rest 429 at once), so a browser with the right key at
    a fourth network signs in."""
    options = {"api_key": KEY, "sign_in_timeout": 20.0, "max_connections": 256}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        address = address_of(url)
        held: list[socket.socket] = []
        for n in range(96):
            sock = connect_from(f"127.0.{20 + n % 3}.2", address)
            sock.sendall(SIGN_IN_HEAD)
            held.append(sock)
        time.sleep(1)  # the server has read what it will
        transport = httpx.HTTPTransport(local_address="127.0.23.2")
        with httpx.Client(transport=transport, timeout=30) as browser:
            answers = [browser.post(f"{url}login", data={"key": KEY}).status_code
                       for _ in range(5)]  # fmt: skip
        for sock in held:
            sock.close()
    assert answers == [303] * 5, answers


def test_one_network_holds_its_share_of_connections_whatever_its_addresses(onnx_gallery):
    options = {"max_client_connections": 4}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        address = address_of(url)
        mine = [connect_from(f"127.0.30.{2 + n}", address) for n in range(4)]
        extra = connect_from("127.0.30.9", address)  # the same /24: over its share
        extra.settimeout(10)
        assert extra.recv(4096).startswith(b"HTTP/1.1 429")
        transport = httpx.HTTPTransport(local_address="127.0.31.2")
        with httpx.Client(transport=transport, timeout=30) as client:
            other = client.get(f"{url}api/health")
        assert other.status_code == 200
        for sock in [*mine, extra]:
            sock.close()


def test_a_free_slot_goes_first_to_an_identity_with_nothing_in_flight():
    """A runs one piece and waits with three more; B runs one and waits with one more; C
    arrives last with nothing in flight: C's piece starts before A's and B's waiting ones."""
    order: list[str] = []
    release = {"a0": threading.Event(), "b0": threading.Event()}

    def piece(name: str):
        def work() -> None:
            order.append(name)
            if name in release:
                release[name].wait(10)

        return work

    async def main() -> None:
        gate = WorkGate(2, 16, per_client=8)
        tasks = [asyncio.create_task(gate.run(piece("a0"), "A")),
                 asyncio.create_task(gate.run(piece("b0"), "B"))]  # fmt: skip
        await asyncio.sleep(0.05)
        tasks += [asyncio.create_task(gate.run(piece(f"a{n}"), "A")) for n in (1, 2, 3)]
        tasks.append(asyncio.create_task(gate.run(piece("b1"), "B")))
        await asyncio.sleep(0.05)
        tasks.append(asyncio.create_task(gate.run(piece("c0"), "C")))
        await asyncio.sleep(0.05)
        release["a0"].set()  # one slot comes free: whose turn is it?
        for _ in range(500):  # at most 5 s
            if len(order) > 2:
                break
            await asyncio.sleep(0.01)
        release["b0"].set()
        await asyncio.gather(*tasks)

    asyncio.run(main())
    # a0 and b0 start together on the two slots, in either order
    assert sorted(order[:2]) == ["a0", "b0"] and order[2] == "c0", order
    assert set(order) == {"a0", "a1", "a2", "a3", "b0", "b1", "c0"}


def test_plain_searches_wait_their_turn_in_a_gate_of_their_own(onnx_gallery):
    from nearsight.app.server_app import served

    with running_page([onnx_gallery.gallery], analyse=False) as (url, demo):
        gate = served(demo).rest.state.rest.plain
        assert isinstance(gate, WorkGate) and gate.concurrency >= 2
        answer = httpx.post(f"{url}api/search", json={"id": 1, "k": 2}, timeout=30)
        assert answer.status_code == 200 and gate.running == 0
