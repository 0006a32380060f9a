"""Security defaults and the loading state, on a real server whose models never finish loading."""

from __future__ import annotations

import threading

import pytest

from localspec.cli import main
from localspec.errors import UsageError
from localspec.server import Backend, ServerSettings, create_app, is_loopback
from tests.server_harness import ServerThread, request

KEY = "s3cret-key"


@pytest.fixture(scope="module")
def loading_server():
    never = threading.Event()

    def blocked(settings: ServerSettings) -> Backend:
        never.wait()
        raise RuntimeError("test over")

    app = create_app(ServerSettings(api_key=KEY, max_body_bytes=2048), load=blocked)
    with ServerThread(app) as srv:
        yield srv
        never.set()


def test_non_loopback_bind_without_key_is_refused(capsys):
    with pytest.raises(UsageError, match="without an API key"):
        ServerSettings(host="0.0.0.0").check_bind()
    ServerSettings(host="0.0.0.0", api_key="k").check_bind()  # with a key it is allowed
    ServerSettings(host="::1").check_bind()
    assert main(["serve", "--host", "0.0.0.0", "--no-pull"]) == 2
    err = capsys.readouterr().err
    assert "without an API key" in err and "--api-key" in err


def test_api_key_from_environment(monkeypatch):
    monkeypatch.setenv("LOCALSPEC_API_KEY", "from-env")
    s = ServerSettings(host="192.168.1.5").with_env_key()
    assert s.api_key == "from-env"
    s.check_bind()


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("localhost", True), ("::1", True),
                                            ("0.0.0.0", False), ("10.0.0.2", False), ("example.com", False)])
def test_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_auth_required_and_constant_shape(loading_server):
    base = loading_server.base_url
    for key in (None, "wrong", KEY + "x", ""):
        r = request(base, "GET", "/v1/models", key)
        assert r.status_code == 401
        assert r.json()["error"]["type"] == "authentication_error"
        assert r.headers["WWW-Authenticate"] == "Bearer"
    # With the key the request passes auth and meets the loading state.
    r = request(base, "GET", "/v1/models", KEY)
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_loading"
    assert request(base, "GET", "/metrics", None).status_code == 401
    assert request(base, "GET", "/metrics", KEY).status_code == 200


def test_health_and_docs_open_while_loading(loading_server):
    r = request(loading_server.base_url, "GET", "/health")
    assert r.status_code == 503 and r.json()["status"] == "loading"
    assert request(loading_server.base_url, "GET", "/openapi.json").status_code == 200


def test_validation_is_400_not_422(loading_server):
    r = request(loading_server.base_url, "POST", "/v1/chat/completions", KEY, {"model": "x"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == "messages"


def test_body_limit_is_413(loading_server):
    r = request(loading_server.base_url, "POST", "/v1/chat/completions", KEY,
                {"model": "x", "messages": [{"role": "user", "content": "y" * 4000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"


def test_unknown_route_uses_error_object(loading_server):
    r = request(loading_server.base_url, "GET", "/v1/nothing", KEY)
    assert r.status_code == 404 and "error" in r.json()


def test_cors_off_by_default_on_when_configured(loading_server):
    origin = {"Origin": "https://editor.example"}
    r = request(loading_server.base_url, "GET", "/health", headers=origin)
    assert "access-control-allow-origin" not in {k.lower() for k in r.headers}
    never = threading.Event()
    app = create_app(ServerSettings(cors_origins=["https://editor.example"]), load=lambda s: never.wait())
    with ServerThread(app) as srv:
        r = request(srv.base_url, "GET", "/health", headers=origin)
        assert r.headers["access-control-allow-origin"] == "https://editor.example"
        never.set()
