"""Host and Origin checks (api/middleware/hosts.py): the pure decisions over a table, then the
app: a foreign Host or page is refused 403 in the route's own envelope, before any work."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import httpx
import pytest

from model_boss.api.middleware.hosts import (
    POLICY_VIOLATION,
    HostGuard,
    host_allowed,
    host_name,
    origin_allowed,
    own_names,
    page_origins,
)
from model_boss.errors import ConfigError
from model_boss.settings import LOOPBACK_ORIGINS, Settings, load_settings

from .fakes import coordinator, manifest, started_client

NAMES = own_names(Settings(allowed_hosts=["models.example.com", "*.example.org"],
                           advertise_url="http://member-a.internal:8210"), "gpubox.lan")


@pytest.mark.parametrize("host, allowed", [
    ("127.0.0.1:8210", True),
    ("127.0.0.1", True),
    ("[::1]:8210", True),
    ("[::1]", True),
    ("192.168.1.20:8210", True),  # any IP literal: a page cannot rebind a literal address
    ("[fe80::1]:80", True),
    ("localhost:8210", True),
    ("LOCALHOST", True),
    ("localhost.", True),
    ("app.localhost:3000", True),
    ("gpubox.lan:8210", True),  # the machine's hostname
    ("gpubox:8210", True),  # and its first label
    ("member-a.internal:8210", True),  # advertise_url: where cluster members forward
    ("models.example.com", True),  # allowed_hosts, exact
    ("a.example.org:8210", True),  # allowed_hosts, *.example.org
    ("deep.a.example.org", True),
    ("example.org", False),  # *.example.org is its subdomains only
    ("evilexample.org", False),
    ("example.org.evil.com", False),
    ("evil.com:8210", False),  # a rebinding page's own name
    ("localhost.evil.com", False),
    ("127.0.0.1.nip.io", False),
    ("gpubox.evil.com", False),
    (":8210", False),
])
def test_a_host_is_one_of_the_coordinators_names(host, allowed):
    assert host_allowed(host, NAMES) is allowed


def test_a_star_allows_any_host():
    assert host_allowed("evil.com:8210", own_names(Settings(allowed_hosts=["*"]), "box"))


@pytest.mark.parametrize("host, name", [
    ("Example.ORG:80", "example.org"), ("[::1]:8210", "::1"), ("[::1]", "::1"),
    ("::1", "::1"), ("box.", "box"), ("box", "box"),
])
def test_the_name_in_a_host_header(host, name):
    assert host_name(host) == name


LOOPBACK_PAGES = page_origins(LOOPBACK_ORIGINS)


@pytest.mark.parametrize("origins, origin, host, allowed", [
    (LOOPBACK_ORIGINS, "http://localhost:5173", "127.0.0.1:8210", True),  # cors_origins
    (LOOPBACK_ORIGINS, "http://127.0.0.1:8210", "127.0.0.1:8210", True),
    (LOOPBACK_ORIGINS, "http://localhost:5173", None, True),
    # the page's own origin: the dashboard served from a LAN address, or behind TLS
    (LOOPBACK_ORIGINS, "http://192.168.1.20:8210", "192.168.1.20:8210", True),
    (LOOPBACK_ORIGINS, "https://gpubox.lan", "gpubox.lan", True),
    (LOOPBACK_ORIGINS, "http://192.168.1.20:8210", "127.0.0.1:8210", False),
    (LOOPBACK_ORIGINS, "https://evil.com", "127.0.0.1:8210", False),
    (LOOPBACK_ORIGINS, "https://evil.com", None, False),
    (LOOPBACK_ORIGINS, "http://localhost.evil.com", "127.0.0.1:8210", False),
    (LOOPBACK_ORIGINS, "null", "127.0.0.1:8210", False),  # a sandboxed page, a file
    (LOOPBACK_ORIGINS, "file://", "127.0.0.1", False),
    (LOOPBACK_ORIGINS, "ftp://127.0.0.1", "127.0.0.1", False),
    (["https://app.example"], "https://app.example", "127.0.0.1", True),
    (["https://app.example"], "https://app.example:8443", "127.0.0.1", False),
    (["https://app.example"], "http://localhost:5173", "127.0.0.1", False),
    (["http://tool.lan:*"], "http://tool.lan:3000", "127.0.0.1", True),
    (["*"], "https://evil.com", "127.0.0.1", True),
    (["*"], "null", "127.0.0.1", True),
    ([], "http://localhost:5173", "127.0.0.1", False),
])
def test_a_page_may_call_when_cors_origins_lists_it_or_it_is_the_requests_own(
        origins, origin, host, allowed):
    assert origin_allowed(origin, host, page_origins(origins)) is allowed


def test_allowed_hosts_are_validated_and_the_error_names_the_field():
    assert Settings(allowed_hosts=["Models.Example.COM.", "*.example.org", "*", "gpu_box"]
                    ).allowed_hosts == ["models.example.com", "*.example.org", "*", "gpu_box"]
    for wrong in ["http://models.example.com", "models.example.com:8210", "*example.org",
                  "a.*.org", "", "two words", "[::1]"]:
        with pytest.raises(ConfigError, match="allowed_hosts"):
            load_settings(allowed_hosts=[wrong])


# --- the guard in the app ----------------------------------------------------------------

FOREIGN = {"host": "evil.com:8210"}
CHAT = {"model": "a", "messages": [{"role": "user", "content": "hi"}]}


def openai_refusal(response: httpx.Response, code: str) -> None:
    assert response.status_code == 403, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["type"] == "permission_error" and error["message"]


@pytest.fixture
async def api(tmp_path):
    coord, log = coordinator(tmp_path, [manifest("a", 1000)],
                             allowed_hosts=["models.example.com", "*.example.org"])
    async with started_client(coord) as client:
        yield client, coord, log


async def test_a_foreign_host_is_refused_on_every_route_in_its_envelope(api):
    client, coord, log = api
    openai_refusal(await client.get("/v1/models", headers=FOREIGN), "host_not_allowed")
    openai_refusal(await client.get("/api/v1/leases", headers=FOREIGN), "host_not_allowed")
    openai_refusal(await client.get("/metrics", headers=FOREIGN), "host_not_allowed")
    openai_refusal(await client.get("/health", headers=FOREIGN), "host_not_allowed")
    openai_refusal(await client.post("/v1/chat/completions", json=CHAT, headers=FOREIGN),
                   "host_not_allowed")

    changed = await client.put("/api/v1/config", json={"allowCloudFallback": False},
                               headers=FOREIGN)
    openai_refusal(changed, "host_not_allowed")
    assert (await client.get("/api/v1/config")).json() == {"allowCloudFallback": True}

    pulled = await client.post("/api/pull", json={"model": "hf.co/a/b"}, headers=FOREIGN)
    assert pulled.status_code == 403
    assert set(pulled.json()) == {"error"} and "evil.com" in pulled.json()["error"]

    message = await client.post("/v1/messages", content="model=a&max_tokens=5",
                                headers={**FOREIGN, "content-type":
                                         "application/x-www-form-urlencoded"})
    assert message.status_code == 403
    body = message.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == "permission_error" and "evil.com" in body["error"]["message"]

    assert coord.pulls.status() == [] and coord.queue.depth == 0 and log == []


async def test_a_foreign_page_does_nothing_whatever_its_content_type(api):
    client, coord, log = api
    page = {"origin": "https://evil.com", "content-type": "text/plain"}
    pulled = await client.post("/api/pull", content='{"model": "hf.co/a/b"}', headers=page)
    assert pulled.status_code == 403 and "evil.com" in pulled.json()["error"]
    chat = await client.post("/v1/chat/completions", content=json.dumps(CHAT), headers=page)
    openai_refusal(chat, "origin_not_allowed")
    form = await client.post("/v1/chat/completions", content="model=a",
                             headers={**page, "content-type": "application/x-www-form-urlencoded"})
    openai_refusal(form, "origin_not_allowed")
    openai_refusal(await client.post("/v1/chat/completions", json=CHAT,
                                     headers={"origin": "null"}), "origin_not_allowed")
    assert coord.pulls.status() == [] and coord.queue.depth == 0 and log == []


@pytest.mark.parametrize("host", [
    "127.0.0.1", "127.0.0.1:8210", "localhost:8210", "[::1]:8210", "192.168.1.20:8210",
    "models.example.com", "a.example.org:8210",
])
async def test_the_coordinators_own_names_are_served(api, host):
    client, _, _ = api
    assert (await client.get("/v1/models", headers={"host": host})).status_code == 200


async def test_a_name_allowed_hosts_does_not_list_is_refused(api):
    client, _, _ = api
    openai_refusal(await client.get("/v1/models", headers={"host": "example.org"}),
                   "host_not_allowed")


async def test_a_page_calling_its_own_origin_is_served(api):
    client, _, log = api
    lan = {"host": "192.168.1.20:8210", "origin": "http://192.168.1.20:8210"}
    served = await client.post("/v1/chat/completions", json=CHAT, headers=lan)
    assert served.status_code == 200, served.text
    assert ("request", "a", None) in log


# --- the guard alone: requests without a Host, websockets, lifespan -----------------------

def guard() -> tuple[HostGuard, list]:
    reached: list = []

    async def inner(scope, receive, send):
        reached.append(scope["type"])

    settings = Settings()
    return HostGuard(inner, SimpleNamespace(settings=settings)), reached


async def call(app, scope) -> list[dict]:
    sent: list[dict] = []

    async def receive():
        return {"type": "websocket.connect"}

    async def send(message):
        sent.append(message)

    await app(scope, receive, send)
    return sent


def scope(kind: str, headers: list[tuple[bytes, bytes]]) -> dict:
    return {"type": kind, "path": "/v1/models", "method": "GET", "headers": headers,
            "query_string": b"", "scheme": "http" if kind == "http" else "ws"}


async def test_a_request_without_a_host_header_is_served():
    app, reached = guard()
    assert await call(app, scope("http", [])) == [] and reached == ["http"]


async def test_a_websocket_from_a_foreign_host_or_page_is_closed_before_its_accept():
    for headers in ([(b"host", b"evil.com")],
                    [(b"host", b"127.0.0.1"), (b"origin", b"https://evil.com")]):
        app, reached = guard()
        sent = await call(app, scope("websocket", headers))
        assert [m["type"] for m in sent] == ["websocket.close"] and reached == []
        assert sent[0]["code"] == POLICY_VIOLATION
    app, reached = guard()
    await call(app, scope("websocket", [(b"host", b"localhost:8210")]))
    assert reached == ["websocket"]


async def test_lifespan_passes():
    app, reached = guard()
    await call(app, {"type": "lifespan"})
    assert reached == ["lifespan"]


# --- the warning for an open address without keys ---------------------------------------

@pytest.mark.parametrize("settings, warned", [
    ({"host": "0.0.0.0"}, True),
    ({"host": "192.168.1.20"}, True),
    ({"host": "gpubox.lan"}, True),
    ({"host": "127.0.0.1"}, False),
    ({"host": "::1"}, False),
    ({"host": "localhost"}, False),
    ({"host": "0.0.0.0", "api_key": "user-key"}, False),
    ({"host": "0.0.0.0", "api_keys": {"alice": "alice-key"}}, False),
    ({"host": "0.0.0.0", "admin_api_key": "admin-key"}, False),
])
async def test_an_open_address_without_keys_is_warned_about_in_the_log_and_the_status(
        tmp_path, caplog, settings, warned):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)], **settings)
    with caplog.at_level(logging.WARNING, logger="model_boss.coordinator"):
        async with started_client(coord) as client:
            key = settings.get("admin_api_key") or settings.get("api_key") \
                or settings.get("api_keys", {}).get("alice", "")
            status = (await client.get("/api/v1/status",
                                       headers={"authorization": f"Bearer {key}"})).json()
    said = [r.getMessage() for r in caplog.records if "without API keys" in r.getMessage()]
    if warned:
        assert coord.exposure_warning and "api_keys" in coord.exposure_warning
        assert "run models" in coord.exposure_warning and "pull models" in coord.exposure_warning
        assert said == [coord.exposure_warning] and status["warnings"] == said
    else:
        assert coord.exposure_warning is None and said == [] and status["warnings"] == []


async def test_the_dashboard_comes_with_the_warning_and_a_place_to_show_it(tmp_path):
    coord, _ = coordinator(tmp_path, [manifest("a", 1000)], host="0.0.0.0")
    async with started_client(coord) as client:
        page = (await client.get("/ui/")).text
        script = (await client.get("/ui/dashboard.js")).text
    assert 'id="warnings"' in page and coord.exposure_warning in page  # the first snapshot
    assert "s.warnings" in script and '$("#warnings")' in script
