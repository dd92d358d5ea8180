"""What an HTTP request to ``omnijax serve`` must pass before any handler runs: the Host header (demo/host_check.py),
the API key (demo/api_key.py) and the body size (demo/body_limit.py); and the web demo mounted on the same app
(``--ui``). In-process, through the ASGI app (the server process itself is driven in test_server.py)."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient

from omnijax.demo.host_check import allowed_names
from omnijax.demo.server import build_app, serving

URL = "http://127.0.0.1:8000"


@pytest.fixture(scope="module")
def server(gemma3_pipeline):
    with serving(gemma3_pipeline, model="tiny") as s:
        yield s


def test_only_the_hosts_it_listens_on(server):
    client = TestClient(build_app(server, names=allowed_names("127.0.0.1")), base_url=URL)
    assert client.get("/v1/models").status_code == 200
    assert client.get("/v1/models", headers={"Host": "localhost:8000"}).status_code == 200
    for host in ("attacker.example:8000", "127.0.0.1.nip.io:8000"):
        refused = client.get("/v1/models", headers={"Host": host})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "host_not_allowed"


def test_api_key(server):
    client = TestClient(build_app(server, names=allowed_names("127.0.0.1"), api_key="s3cret"), base_url=URL)
    assert client.get("/health").status_code == 200  # open, for load balancers
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
        r = client.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).json()["data"][0]["id"] == "tiny"
    assert client.get("/metrics", headers={"Authorization": "bearer s3cret"}).status_code == 200


def test_an_empty_api_key_is_refused_not_taken_for_none(server, tiny_gemma3_dir, capsys):
    """``--api-key ''`` (an unset variable in a script) must not serve everyone: the command stops before loading
    the model; the app refuses an empty key."""
    from omnijax.demo.cli import main

    for key in ("", "  "):
        with pytest.raises(ValueError, match="must not be empty"):
            build_app(server, names=allowed_names("127.0.0.1"), api_key=key)
        assert main(["serve", "--model", str(tiny_gemma3_dir), "--port", "1", "--api-key", key]) == 2
        assert "--api-key is empty" in capsys.readouterr().err


def test_body_cap_declared_or_streamed(server):
    client = TestClient(build_app(server, names=allowed_names("127.0.0.1"), max_body_mb=0.01), base_url=URL)
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
    client = TestClient(build_app(server, names=allowed_names("127.0.0.1"), ui=ui), base_url=URL)
    page = client.get("/ui/")
    assert page.status_code == 200 and "<html" in page.text.lower()
    assert client.get("/v1/models").status_code == 200
    assert client.get("/ui/", headers={"Host": "attacker.example"}).status_code == 400


def test_a_closed_engine_is_a_503_not_a_client_error():
    from omnijax.app.scheduler import ClosedError, QueueFullError
    from omnijax.demo.server import _refusal

    assert _refusal(ClosedError("the pipeline is closed")).status_code == 503
    assert _refusal(QueueFullError("full")).status_code == 503
