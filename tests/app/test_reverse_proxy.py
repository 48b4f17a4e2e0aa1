"""The shipped reverse-proxy setup (deploy/nginx/nearsight.conf) in front of a real server:
nginx from the system's packages, when it is installed (skipped, saying so, when not).
Through it the client is the address nginx saw, not the proxy's, and the key is needed on
every route, the one Gradio's launch used to call included (issue 51, item 11)."""

from __future__ import annotations

import re
import shutil
import subprocess
import time

import httpx
import pytest
from helpers import ROOT, free_port, running_page, started

NGINX = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
KEY = "k" * 24

pytestmark = pytest.mark.skipif(NGINX is None, reason="nginx is not installed "
                                "(apt install nginx-light runs this test)")  # fmt: skip


def _config(tmp_path, listen: int, upstream: int) -> str:
    site = (ROOT / "deploy" / "nginx" / "nearsight.conf").read_text()
    site = re.sub(r"listen 80;", f"listen 127.0.0.1:{listen};", site)
    site = site.replace("http://127.0.0.1:7860", f"http://127.0.0.1:{upstream}")
    temp = tmp_path / "nginx"
    temp.mkdir()
    return (
        f"daemon off;\nworker_processes 1;\npid {temp}/nginx.pid;\nerror_log stderr;\n"
        "events { worker_connections 256; }\n"
        f"http {{\n access_log off;\n client_body_temp_path {temp}/body;\n"
        f" proxy_temp_path {temp}/proxy;\n fastcgi_temp_path {temp}/fcgi;\n"
        f" uwsgi_temp_path {temp}/uwsgi;\n scgi_temp_path {temp}/scgi;\n{site}\n}}\n"
    )


def test_behind_nginx_the_client_is_who_nginx_saw_and_the_key_is_needed(onnx_gallery, tmp_path,
                                                                         capfd):  # fmt: skip
    options = {"api_key": KEY, "forwarded_allow_ips": "127.0.0.1", "access_log": True}
    with running_page([onnx_gallery.gallery], analyse=False, **options) as (url, _):
        upstream = int(url.rstrip("/").rsplit(":", 1)[1])
        listen = free_port()
        config = tmp_path / "nginx.conf"
        config.write_text(_config(tmp_path, listen, upstream))
        checked = subprocess.run([NGINX, "-t", "-c", config, "-p", tmp_path], capture_output=True,
                                 text=True, timeout=60)  # fmt: skip
        assert checked.returncode == 0, checked.stderr
        proxy = f"http://127.0.0.1:{listen}"
        with started([NGINX, "-c", config, "-p", tmp_path], stderr=subprocess.DEVNULL):
            transport = httpx.HTTPTransport(local_address="127.0.40.2")
            with httpx.Client(transport=transport, timeout=30) as client:
                for _ in range(100):  # nginx is up within seconds
                    try:
                        health = client.get(f"{proxy}/api/health")
                        break
                    except httpx.TransportError:
                        time.sleep(0.1)
                assert health.status_code == 200
                spoofed = {"X-Forwarded-For": "198.51.100.7", "X-API-Key": KEY}
                item = client.get(f"{proxy}/api/items/1", headers=spoofed)
                assert item.status_code == 200, item.text
                for path in ("/gradio_api/startup-events", "/config", "/api/items/1"):
                    assert client.get(f"{proxy}{path}").status_code == 401, path
                found = client.post(f"{proxy}/api/search", json={"id": 1, "k": 2},
                                    headers={"X-API-Key": KEY})  # fmt: skip
                assert found.status_code == 200 and len(found.json()["neighbours"]) == 2
    err = capfd.readouterr().err
    assert "nearsight: 127.0.40.2 GET /api/health 200 " in err
    assert "nearsight: 127.0.40.2 GET /api/items/1 200 " in err  # not the client's claim
    assert "198.51.100.7" not in err
