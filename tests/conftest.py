"""The suite's shared fixtures; the plain helpers they call are in tests/helpers/.

Each fixture that makes a folder deletes it when its scope ends, so a session holds only what
its running tests need (pytest's own tmp_path folders are deleted as each test passes:
tmp_path_retention_policy in pyproject.toml)."""

from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from helpers import (
    OnnxGallery,
    TinyGallery,
    build_wheel,
    make_onnx_gallery,
    make_product,
    make_shop,
    make_staged_gallery,
    make_tiny_gallery,
    running_page,
)

T = TypeVar("T")


def built_in(tmp_path_factory, name: str, make: Callable[[Path], T]) -> Iterator[T]:
    """``make(root)`` in a new folder named after ``name``, deleted when the fixture ends."""
    root = tmp_path_factory.mktemp(name)
    yield make(root)
    shutil.rmtree(root, ignore_errors=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Files holding slow tests run first. pytest-xdist (``--dist loadfile``) hands whole files
    to its workers in collection order; started last, a long file ran alone at the end while
    the other core idled. Longest first is the classic remedy; the order inside each group,
    and inside each file, is kept."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)


@pytest.fixture(scope="session", autouse=True)
def decode_box_closed_at_the_end() -> Iterator[None]:
    """The decode box's warm workers (started by whatever test decodes an upload in this
    process) stop with the session, before the leftover-process check looks."""
    yield
    from nearsight.data.decode_box import close_shared_box

    close_shared_box()


@pytest.fixture(scope="session")
def onnx_gallery(tmp_path_factory) -> Iterator[OnnxGallery]:
    """:func:`helpers.make_onnx_gallery`, built once per session."""
    yield from built_in(tmp_path_factory, "onnx-gallery", make_onnx_gallery)


@pytest.fixture(scope="module")
def synthetic_folder(tmp_path_factory) -> Iterator[Callable[..., Path]]:
    """``make(classes=8, per_class=4, size=32)``: a synthetic image folder (seed 0), written
    once per module and settings."""
    from nearsight.data.datasets.synthetic import write_synthetic

    made: dict[tuple[int, int, int], Path] = {}

    def make(classes: int = 8, per_class: int = 4, size: int = 32) -> Path:
        key = (classes, per_class, size)
        if key not in made:
            made[key] = tmp_path_factory.mktemp("synth") / "data"
            write_synthetic(made[key], classes=classes, per_class=per_class, size=size, seed=0)
        return made[key]

    yield make
    for root in made.values():
        shutil.rmtree(root.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def synth(synthetic_folder) -> Path:
    """8 synthetic classes of 4 images at 32 px (the training tests' folder)."""
    return synthetic_folder()


@pytest.fixture(scope="session")
def nearsight_wheel(tmp_path_factory) -> Iterator[Path]:
    """A wheel of the checkout, built once per session."""
    yield from built_in(tmp_path_factory, "wheel", build_wheel)


@pytest.fixture(scope="module")
def staged(onnx_gallery, tmp_path_factory) -> Iterator[dict]:
    """:func:`helpers.make_staged_gallery`: a gallery, its layer3 re-ranker and stored
    features."""
    pytest.importorskip("torch")  # rerank train
    root = tmp_path_factory.mktemp("staged")
    yield make_staged_gallery(root, onnx_gallery.model)
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Iterator[TinyGallery]:
    """:func:`helpers.make_tiny_gallery`, built once per test module that asks for it."""
    yield from built_in(tmp_path_factory, "tiny", make_tiny_gallery)


@pytest.fixture(scope="module")
def tiny_page(tiny):
    """(url, app): the page over the ``tiny`` gallery, served for the whole module."""
    with running_page([tiny.gallery]) as served:
        yield served


@pytest.fixture(scope="module")
def product(tmp_path_factory) -> Iterator[dict]:
    """:func:`helpers.make_product`: a gallery with shop, price and sku columns."""
    yield from built_in(tmp_path_factory, "product", make_product)


@pytest.fixture(scope="module")
def shop(tmp_path_factory) -> Iterator[dict]:
    """:func:`helpers.make_shop`: a shop's catalog with a key column, dates and unicode."""
    yield from built_in(tmp_path_factory, "shop", make_shop)


@pytest.fixture()
def empty_hub(tmp_path, monkeypatch) -> Iterator[Path]:
    """torch.hub's cache in an empty folder, restored afterwards."""
    import torch

    hub = tmp_path / "hub"
    previous = torch.hub.get_dir()  # before TORCH_HOME moves: get_dir() follows it
    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    torch.hub.set_dir(str(hub))
    yield hub
    torch.hub.set_dir(previous)


@pytest.fixture()
def no_network(monkeypatch) -> None:
    """Every DNS lookup and TCP connection fails at once (a machine offline)."""
    import socket

    def refuse(*args, **kwargs):
        raise OSError("network blocked by the test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


@pytest.fixture()
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face hub cache, offline: nothing can be downloaded (timm weights;
    :func:`helpers.write_hub_weights` fills it)."""
    cache = tmp_path / "hf-hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


# -- the browser (appended: shared by the page's browser tests) ----------------------------------


@pytest.fixture(scope="module")
def chromium():
    """Debian's chromium (/usr/bin/chromium) under Playwright, launched once per test module
    (module, not session: a file that starts Playwright itself must find none running);
    skips when either is missing (`make test` installs both)."""
    from helpers import CHROMIUM, CHROMIUM_ARGS

    if not CHROMIUM.exists():
        pytest.skip("no /usr/bin/chromium (Debian package chromium; `make test` installs it)")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is missing"
    )
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def browser_context(chromium):
    """A browsing context of the module's :func:`chromium` for one test, its tabs opened in it
    (helpers.open_tab); per test, not per module: a tab in a context shared with the module's
    earlier tabs once never showed a random item's results (cause not found).
    ``context.requests``: the URL of every request its tabs made."""
    from helpers.browser import VIEWPORT

    context = chromium.new_context(viewport=VIEWPORT)
    context.requests = []
    context.on("request", lambda req: context.requests.append(req.url))
    yield context
    context.close()


# -- galleries built once per session (appended) -------------------------------------------------
# For test modules that only read them: such a module overrides ``tiny``, ``product`` or
# ``shop`` with one of these (a module that changes a gallery keeps the module's own build).


@pytest.fixture(scope="session")
def tiny_once(tmp_path_factory) -> Iterator[TinyGallery]:
    """:func:`helpers.make_tiny_gallery`, built once per session."""
    yield from built_in(tmp_path_factory, "tiny-once", make_tiny_gallery)


@pytest.fixture(scope="session")
def product_once(tmp_path_factory) -> Iterator[dict]:
    """:func:`helpers.make_product`, built once per session."""
    yield from built_in(tmp_path_factory, "product-once", make_product)


@pytest.fixture(scope="session")
def shop_once(tmp_path_factory) -> Iterator[dict]:
    """:func:`helpers.make_shop`, built once per session."""
    yield from built_in(tmp_path_factory, "shop-once", make_shop)
