"""What an HTTP request to ``omnijax serve`` must pass before any handler runs (demo/http_guard.py): the Host header,
the API key and the body size; and the web demo mounted on the same app (``--ui``). In-process, through the ASGI
app (the server process itself is driven in test_server.py)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from omnijax.demo.http_guard import allowed_hosts
from omnijax.demo.server import build_app, serving

URL = "http://127.0.0.1:8000"


def test_allowed_hosts():
    loop = allowed_hosts("127.0.0.1", 8000)
    assert {"127.0.0.1:8000", "localhost:8000", "[::1]:8000", "localhost", "127.0.0.1"} <= loop
    assert "evil.example:8000" not in loop and "127.0.0.1.nip.io:8000" not in loop
    lan = allowed_hosts("192.168.1.5", 80, ("omni.lan",))
    assert {"192.168.1.5:80", "omni.lan:80", "omni.lan"} <= lan and "localhost:80" not in lan
    assert "localhost:9000" in allowed_hosts("0.0.0.0", 9000)


@pytest.fixture(scope="module")
def server(gemma3_pipeline):
    with serving(gemma3_pipeline, model="tiny") as s:
        yield s


def test_only_the_hosts_it_listens_on(server):
    client = TestClient(build_app(server, hosts=allowed_hosts("127.0.0.1", 8000)), base_url=URL)
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers={"Host": "localhost:8000"}).status_code == 200
    refused = client.get("/v1/models", headers={"Host": "attacker.example:8000"})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_host"


def test_api_key(server):
    client = TestClient(build_app(server, hosts=None, api_key="s3cret"), base_url=URL)
    assert client.get("/health").status_code == 200  # open, for load balancers
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = client.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).json()["data"][0]["id"] == "tiny"
    assert client.get("/metrics", headers={"Authorization": "bearer s3cret"}).status_code == 200


def test_body_cap_declared_or_streamed(server):
    client = TestClient(build_app(server, hosts=None, max_body_mb=0.01), base_url=URL)
    big = b'{"messages": [{"role": "user", "content": "' + b"x" * 20000 + b'"}]}'
    declared = client.post("/v1/chat/completions", content=big, headers={"Content-Type": "application/json"})
    assert declared.status_code == 413 and declared.json()["error"]["code"] == "body_too_large"
    streamed = client.post("/v1/chat/completions", content=iter([big[i:i + 4096] for i in range(0, len(big), 4096)]),
                           headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413
    small = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                      "max_tokens": 2})
    assert small.status_code == 200 and small.json()["object"] == "chat.completion"


def test_the_web_demo_on_the_same_app(server, gemma3_pipeline):
    from omnijax.demo.web import build_demo

    ui = build_demo(gemma3_pipeline)
    client = TestClient(build_app(server, hosts=allowed_hosts("127.0.0.1", 8000), ui=ui), base_url=URL)
    page = client.get("/ui/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert client.get("/v1/models").status_code == 200
    assert client.get("/ui/", headers={"Host": "attacker.example"}).status_code == 400
