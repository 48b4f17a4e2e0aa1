"""One description of the serving settings: nearsight/app/serve/settings.py's Settings makes
`serve`'s flags, the NEARSIGHT_* variables and the keys of --config; docs/serving.md's table is
the class's; named keys (--keys-file) name their holders."""

from __future__ import annotations

import argparse
from pathlib import Path

import httpx
import pytest
from helpers import ROOT, running_page

from nearsight.app.commands.serve import add_settings_flags, settings_of
from nearsight.app.serve.auth import ApiKeys, read_keys_file
from nearsight.app.serve.settings import Settings, fields, flag_of, settings_table
from nearsight.core.errors import NearsightError


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", type=Path)
    add_settings_flags(parser)
    return parser.parse_args(list(argv))


def test_every_setting_is_a_flag_with_its_default_in_the_help():
    parser = argparse.ArgumentParser()
    add_settings_flags(parser)
    flags = {option for action in parser._actions for option in action.option_strings}
    assert {flag_of(spec.name) for spec in fields()} <= flags
    assert len(fields()) >= 30
    help_text = parser.format_help()
    assert "(default 64)" in help_text and "NEARSIGHT_MAX_QUEUE" in help_text


def test_a_flag_beats_the_environment_which_beats_the_file(tmp_path, monkeypatch):
    config = tmp_path / "serve.toml"
    config.write_text('max_queue = 10\nconcurrency = 3\nhost = "0.0.0.0"\ngallery = ["g1"]\n'
                      "access_log = false\nheader_timeout = 4\n")  # fmt: skip
    config.write_text(config.read_text().replace("gallery =", "galleries ="))
    monkeypatch.setenv("NEARSIGHT_CONCURRENCY", "5")
    monkeypatch.setenv("NEARSIGHT_SECURE_COOKIE", "yes")
    settings = settings_of(_parse("--config", str(config), "--max-queue", "20"))
    assert settings.max_queue == 20  # the flag
    assert settings.concurrency == 5  # the variable
    assert settings.host == "0.0.0.0" and settings.access_log is False  # the file
    assert settings.header_timeout == 4.0 and isinstance(settings.header_timeout, float)
    assert settings.galleries == [tmp_path / "g1"]  # relative to the file
    assert settings.secure_cookie is True
    assert settings.port == Settings().port  # the default
    assert settings_of(_parse("--no-access-log")).access_log is False
    monkeypatch.delenv("NEARSIGHT_CONCURRENCY")
    assert settings_of(_parse()).concurrency == 2


@pytest.mark.parametrize(("where", "text", "message"), [
    ("env", "NEARSIGHT_MAX_QUEUE=many", "NEARSIGHT_MAX_QUEUE must be a int"),
    ("env", "NEARSIGHT_ACCESS_LOG=perhaps", "must be true or false"),
    ("file", "max_queue = 0", "--max-queue must be at least 1"),
    ("file", "colour = 'red'", "unknown setting 'colour'"),
    ("file", "max_queue = [", "is not TOML"),
    ("file", "port = 'x'", "port must be a int"),
])  # fmt: skip
def test_a_bad_setting_is_one_line_naming_it(tmp_path, monkeypatch, where, text, message):
    config = tmp_path / "serve.toml"
    config.write_text(text if where == "file" else "")
    if where == "env":
        name, value = text.split("=")
        monkeypatch.setenv(name, value)
    with pytest.raises(NearsightError, match=message) as raised:
        settings_of(_parse("--config", str(config)))
    assert "\n" not in str(raised.value)


def test_the_docs_table_is_the_settings_class():
    text = (ROOT / "docs" / "serving.md").read_text()
    start = text.index("<!-- settings-table -->\n") + len("<!-- settings-table -->\n")
    end = text.index("\n<!-- /settings-table -->")
    assert text[start:end] == settings_table(), "regenerate it from settings_table()"


def test_a_keys_file_names_each_key_and_refuses_a_bad_line(tmp_path):
    keys_file = tmp_path / "keys"
    keys_file.write_text(
        "# the team\nalice alice-key-0123456789\n\nbob   bob-key-0123456789  # CI\n"
    )
    keys = ApiKeys.of(None, keys_file, "0.0.0.0")
    assert keys is not None and keys.named and len(keys) == 2
    assert keys.match("bob-key-0123456789") == "bob" and keys.match("nope") is None
    assert ApiKeys.of(None, None) is None
    assert not ApiKeys.of("one-key-0123456789").named
    for text, message in [("alice", "a line is NAME KEY"), ("a k1\na k2", "given twice"),
                          ("a k1\nb k1", "a key is given twice"), ("# none\n", "holds no key")]:  # fmt: skip
        keys_file.write_text(text)
        with pytest.raises(NearsightError, match=message):
            read_keys_file(keys_file)
    keys_file.write_text("alice short\n")
    with pytest.raises(NearsightError, match="needs at least 16"):
        ApiKeys.of(None, keys_file, "0.0.0.0")


def test_named_keys_open_the_server_and_name_their_holder_in_the_log(onnx_gallery, tmp_path,
                                                                      capfd):  # fmt: skip
    keys_file = tmp_path / "keys"
    keys_file.write_text("alice alice-key-0123456789\nbob bob-key-0123456789\n")
    options = {"keys_file": keys_file, "access_log": True}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        api = url.rstrip("/") + "/api"
        assert httpx.get(f"{api}/items/1", timeout=30).status_code == 401
        for key in ("alice-key-0123456789", "bob-key-0123456789"):
            answer = httpx.get(f"{api}/items/1", headers={"X-API-Key": key}, timeout=30)
            assert answer.status_code == 200, answer.text
        with httpx.Client(base_url=url.rstrip("/"), timeout=30) as browser:
            signed = browser.post("/login", data={"key": "bob-key-0123456789"})
            assert signed.status_code == 303
            assert browser.get("/gradio_api/info").status_code == 200  # the cookie
    err = capfd.readouterr().err
    assert "nearsight: alice@127.0.0.1 GET /api/items/1 200 " in err
    assert "nearsight: bob@127.0.0.1 GET /api/items/1 200 " in err
    assert "nearsight: bob@127.0.0.1 GET /gradio_api/info 200 " in err
    assert "nearsight: 127.0.0.1 GET /api/items/1 401 " in err
