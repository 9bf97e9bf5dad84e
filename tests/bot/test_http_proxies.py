"""Behind a reverse proxy (``http.trusted_proxies``): the client is the address the trusted proxy chain names, for
rate limits, ``trusted_networks`` and the wrong-token lockout; a peer that is not a trusted proxy names nobody. And
the lockout itself: after 10 wrong tokens the right one is refused too, until the bucket refills."""

from __future__ import annotations

import pytest
from tests.bot.http_proxy import ReverseProxy
from tests.bot.test_http_fakes import start

from bot.http import guard

TOKEN_ENV = "VOICEBOT_TEST_PROXY_TOKEN"


async def statuses(session, url: str, n: int, headers: dict[str, str]) -> list[int]:
    out = []
    for _ in range(n):
        async with session.get(url + "/v1/models", headers=headers) as r:
            out.append(r.status)
            if r.status == 429:
                message = (await r.json())["message"]
    if 429 in out:
        out.append(message)  # type: ignore[arg-type]
    return out


async def test_each_client_behind_a_trusted_proxy_has_its_own_rate_limit(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"trusted_proxies": ["127.0.0.1"], "rate_limit_per_min": 2})
    try:
        a = {"X-Forwarded-For": "203.0.113.1"}
        got = await statuses(session, srv.url, 3, a)
        assert got[:3] == [200, 200, 429]
        assert got[3].startswith("too many requests from 203.0.113.1: the limit is 2 a minute")
        assert await statuses(session, srv.url, 2, {"X-Forwarded-For": "203.0.113.2"}) == [200, 200]
        assert await statuses(session, srv.url, 1, {"Forwarded": 'for="[2001:db8::7]:4711";proto=https'}) == [200]
        # a client that sends its own X-Forwarded-For through the proxy only prepends to what the proxy adds
        spoofed = {"X-Forwarded-For": "198.51.100.9, 203.0.113.1"}
        assert (await statuses(session, srv.url, 1, spoofed))[0] == 429
    finally:
        await srv.close()


@pytest.mark.parametrize("proxies", [[], ["10.0.0.1"]])
async def test_forwarded_headers_from_an_untrusted_peer_are_ignored(tmp_path, session, proxies) -> None:
    srv = await start(tmp_path, http={"trusted_proxies": proxies, "rate_limit_per_min": 2})
    try:
        assert await statuses(session, srv.url, 1, {"X-Forwarded-For": "203.0.113.1"}) == [200]
        got = await statuses(session, srv.url, 2, {"X-Forwarded-For": "203.0.113.2"})
        assert got[:2] == [200, 429] and "from 127.0.0.1" in got[2]  # one bucket: the peer's
    finally:
        await srv.close()


async def test_trusted_networks_see_the_client_not_the_proxy(tmp_path, session, monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV, "trusted_proxies": ["127.0.0.0/8"],
                                      "trusted_networks": ["192.168.1.0/24"]})
    try:
        for headers, status in [({"X-Forwarded-For": "192.168.1.5"}, 200),
                                ({"X-Forwarded-For": "192.168.1.5, 127.0.0.2"}, 200),  # two trusted hops
                                ({"Forwarded": "for=192.168.1.7, for=127.0.0.3"}, 200),
                                ({"X-Forwarded-For": "203.0.113.9"}, 401),
                                ({"X-Forwarded-For": "192.168.1.5, 203.0.113.9"}, 401),  # the left part is a claim
                                ({"X-Forwarded-For": "unknown"}, 401),  # the proxy itself: not in the LAN
                                ({}, 401)]:
            async with session.get(srv.url + "/v1/models", headers=headers) as r:
                assert r.status == status, headers
    finally:
        await srv.close()


async def test_the_lockout_refuses_the_right_token_until_the_bucket_refills(tmp_path, session,
                                                                           monkeypatch) -> None:
    monkeypatch.setenv(TOKEN_ENV, "s3cret")
    srv = await start(tmp_path, http={"token_env": TOKEN_ENV, "trusted_proxies": ["127.0.0.1"]})
    now = [1000.0]
    srv.runner.app[guard.AUTH_FAILURES].clock = lambda: now[0]  # a fake clock: no sleeping, no timing race
    try:
        def who(address: str, token: str) -> dict[str, str]:
            return {"X-Forwarded-For": address, "Authorization": f"Bearer {token}"}

        got = [await statuses(session, srv.url, 1, who("203.0.113.1", "wrong")) for _ in range(10)]
        assert got == [[401]] * 10
        locked = await statuses(session, srv.url, 1, who("203.0.113.1", "s3cret"))
        assert locked == [429, "too many wrong tokens from 203.0.113.1: retry in 6 s with the right one"]
        assert await statuses(session, srv.url, 1, who("203.0.113.2", "s3cret")) == [200]  # another client
        now[0] += 5.9
        assert (await statuses(session, srv.url, 1, who("203.0.113.1", "s3cret")))[0] == 429
        now[0] += 0.2  # one token back: 10 a minute
        assert await statuses(session, srv.url, 1, who("203.0.113.1", "s3cret")) == [200]
    finally:
        await srv.close()


async def test_through_a_real_reverse_proxy(tmp_path, session) -> None:
    srv = await start(tmp_path, http={"trusted_proxies": ["127.0.0.1"], "rate_limit_per_min": 1})
    alice = await ReverseProxy(srv.url, forwarded_for="198.51.100.1").start()
    bob = await ReverseProxy(srv.url, forwarded_for="198.51.100.2").start()
    try:
        for proxy in (alice, bob):  # each client's first request passes: their buckets are apart
            async with session.get(proxy.url + "/v1/models") as r:
                assert r.status == 200
        async with session.get(alice.url + "/v1/models") as r:
            assert r.status == 429 and "from 198.51.100.1" in (await r.json())["message"]
    finally:
        await alice.close()
        await bob.close()
        await srv.close()
