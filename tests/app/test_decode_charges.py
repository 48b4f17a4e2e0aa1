"""The decode box charges time (issue 51, item 2), against a real server on 127.0.0.1 with real
decode workers: a client whose images hit the decoder's limits waits before its next decode,
and clients with recent failures share ``workers - 1`` workers, so one is always left to the
others.

Before: two clients looping an image that runs into the time limit kept both workers busy for
the whole limit, and another client's upload waited behind them (past its own deadline: 415,
"no image decoder was free")."""

from __future__ import annotations

import io
import threading
import time

import httpx
import numpy as np
import pytest
from helpers import jpeg_scan_bomb, running_page
from PIL import Image

from nearsight.app.serve.clients import network_of
from nearsight.app.serve.decode_shares import DecodeShares
from nearsight.data import decode_box
from nearsight.data.decode_charges import DecodeRefused, DecodeTicket

# a valid progressive JPEG at the pixel cap (64 MP) and under the scan cap (99 scans of 100)
SLOW_SIDE, SLOW_SCANS = 8000, 93
ATTACKERS = ("127.0.2.2", "127.0.3.2")
VICTIM = "127.0.4.2"
VICTIM_UPLOADS = 12  # at least
MAX_VICTIM_UPLOADS = 400


def _photo(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 255, (48, 64, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def _post(client: httpx.Client, url: str, name: str, data: bytes) -> httpx.Response:
    files = {"image": (name, data, "application/octet-stream")}
    return client.post(f"{url}/api/search", files=files, data={"k": "3"})


def _client(address: str) -> httpx.Client:
    return httpx.Client(timeout=120, transport=httpx.HTTPTransport(local_address=address))


@pytest.fixture(scope="module")
def slow_jpeg() -> bytes:
    return jpeg_scan_bomb(SLOW_SIDE, SLOW_SCANS)


@pytest.fixture
def short_decode_limit(slow_jpeg):
    """The decode time limit, set to a third of what the slow JPEG takes on this machine
    (at most 1 s), so it really runs into it; restored after."""
    with decode_box.DecodeBox(1, timeout_s=120) as box:
        box.warm()
        started = time.perf_counter()
        box.decode_bytes(slow_jpeg, "slow.jpg", 32)
        seconds = time.perf_counter() - started
    limit = round(min(1.0, seconds / 3), 2)
    decode_box.configure(timeout_s=limit)
    yield limit
    decode_box.configure(timeout_s=decode_box.DEFAULT_TIMEOUT_S)


@pytest.mark.slow
def test_attackers_looping_a_slow_image_leave_a_worker_to_the_victim(
    onnx_gallery, slow_jpeg, short_decode_limit
):
    """Two identities loop a JPEG that runs into the decode time limit while a third posts
    ordinary uploads: every upload of the victim is answered 200, none was admitted while
    more than one attacker decode was in flight, the attackers together never ran more than
    one decode at once after their first failures, and they were told to wait (429)."""
    from nearsight.app.server_app import served

    slow = slow_jpeg
    attacks: dict[str, list[httpx.Response]] = {address: [] for address in ATTACKERS}
    victim: list[int] = []
    done = threading.Event()

    def attack(address: str) -> None:
        with _client(address) as client:
            for _ in range(400):  # bounded; stopped when the victim is done
                if done.is_set():
                    return
                attacks[address].append(_post(client, url, "slow.jpg", slow))
                done.wait(0.05)

    with running_page([onnx_gallery.gallery], analyse=False, concurrency=2) as (url, page):
        url = url.rstrip("/")
        shares = served(page).decode_shares
        assert shares is not None
        for address in ATTACKERS:  # each fails once: from now on both have recent failures
            with _client(address) as client:
                first = _post(client, url, "slow.jpg", slow)
            assert first.status_code == 415, first.text
            assert f"longer than the limit of {short_decode_limit:g} s" in first.json()["error"]
        threads = [threading.Thread(target=attack, args=(a,)) for a in ATTACKERS]
        for thread in threads:
            thread.start()
        try:
            with _client(VICTIM) as client:
                for n in range(MAX_VICTIM_UPLOADS):  # while the attackers get a few answers
                    if n >= VICTIM_UPLOADS and min(map(len, attacks.values())) >= 4:
                        break
                    answer = _post(client, url, f"photo{n}.png", _photo(n))
                    victim.append(answer.status_code)
                    assert answer.status_code == 200, answer.text
        finally:
            done.set()
            for thread in threads:
                thread.join(300)
        record = shares.record

    assert len(victim) >= VICTIM_UPLOADS and set(victim) == {200}
    assert record.behind[network_of(VICTIM)] <= 1
    assert record.restricted_peak == 1
    for address in ATTACKERS:
        statuses = [answer.status_code for answer in attacks[address]]
        assert set(statuses) <= {415, 429}, statuses
        assert 429 in statuses
        refused = next(answer for answer in attacks[address] if answer.status_code == 429)
        assert int(refused.headers["retry-after"]) >= 1
        assert "hit the decoder's limits" in refused.json()["error"]
        assert record.failures[network_of(address)] >= 1


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _shares(clock: _Clock, who: list[str]) -> DecodeShares:
    return DecodeShares(5.0, recent_s=60.0, identity=lambda: who[0], clock=clock)


def test_a_failure_costs_its_client_the_time_it_held_a_worker():
    clock, who = _Clock(), ["a"]
    shares = _shares(clock, who)  # a time limit of 5 s: an allowance of 1 s
    ticket = shares.admit(2)
    assert not ticket.restricted
    shares.settle(ticket, 4.0, failed=True)
    with pytest.raises(DecodeRefused, match="wait 3 s") as refused:
        shares.admit(2)
    assert refused.value.retry_after_s == 3
    who[0] = "b"  # another client is not charged
    shares.settle(shares.admit(2), 0.2, failed=False)
    who[0] = "a"
    clock.now += 2.5
    with pytest.raises(DecodeRefused, match="wait 1 s"):
        shares.admit(2)
    clock.now += 0.5  # owes the allowance: decoded again, on the share of recent failures
    assert shares.admit(2).restricted


def test_failures_add_up_and_a_success_does_not_pay_them():
    clock, who = _Clock(), ["a"]
    shares = _shares(clock, who)
    shares.settle(shares.admit(2), 3.0, failed=True)
    clock.now += 3.0
    shares.settle(shares.admit(2), 3.0, failed=True)
    shares.settle(DecodeTicket("a"), 0.5, failed=True)  # one admitted before the first failed
    assert shares.owed("a") == pytest.approx(3.5)
    clock.now += 3.5
    shares.settle(shares.admit(2), 0.1, failed=False)
    assert shares.owed("a") == 0.0
    assert shares.admit(2).restricted  # it owed more than the allowance lately
    clock.now += 61.0
    assert not shares.admit(2).restricted  # no longer


def test_a_corrupt_file_or_two_owe_nothing_that_counts():
    clock, who = _Clock(), ["a"]
    shares = _shares(clock, who)
    for _ in range(3):
        shares.settle(shares.admit(2), 0.01, failed=True)
    assert not shares.admit(2).restricted
    assert shares.record.failures["a"] == 3 and not shares.record.refused


@pytest.mark.parametrize("workers", [2, 3, 4])
def test_clients_with_recent_failures_share_all_but_one_worker(workers):
    clock, who = _Clock(), [""]
    shares = _shares(clock, who)
    attackers = [f"attacker{n}" for n in range(workers + 2)]
    for name in attackers:
        who[0] = name
        shares.settle(shares.admit(workers), 2.0, failed=True)
    clock.now += 2.0
    running, refused = [], 0
    for name in attackers:
        who[0] = name
        try:
            running.append(shares.admit(workers))
        except DecodeRefused as error:
            refused += 1
            assert error.retry_after_s >= 1
    assert len(running) == workers - 1 and refused == 3
    who[0] = "victim"  # a client without failures is admitted, behind workers - 1 of theirs
    assert not shares.admit(workers).restricted
    assert shares.record.behind["victim"] == workers - 1
    shares.settle(running[0], 0.5, failed=False)
    who[0] = attackers[-1]
    assert shares.admit(workers).restricted  # a place on the share came free
