"""Webhooks without a database: the Standard Webhooks signature (verified with the
library), the retry schedule, the URL policy."""

from __future__ import annotations

import random
from datetime import UTC, datetime

import pytest
from standardwebhooks import Webhook, WebhookVerificationError

from django_agentrun.conf import DEFAULTS
from django_agentrun.webhooks import (
    UrlRefused,
    check,
    headers,
    pinned,
    problems,
    retry_delay,
    total_seconds,
)
from tests.webhook_receiver import SECRET


def test_headers__verify_with_the_library():
    now = datetime.now(UTC)
    body = b'{"type":"run.completed","data":{"run_id":"r"}}'
    sent = headers(SECRET, "msg_1", now, body)
    assert sent["webhook-id"] == "msg_1"
    assert sent["webhook-timestamp"] == str(int(now.timestamp()))
    assert Webhook(SECRET).verify(body, sent) == {"type": "run.completed", "data": {"run_id": "r"}}


def test_headers__a_changed_body_or_another_secret_fails():
    sent = headers(SECRET, "msg_1", datetime.now(UTC), b"{}")
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(b'{"x":1}', sent)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "QUFBQUFBQUFBQUFBQUFBQQ==").verify(b"{}", sent)


def test_retry_delay__follows_the_schedule_with_bounded_jitter_then_gives_up():
    schedule = [5, 300, 1800]
    rand = random.Random(7)
    for tries, base in enumerate(schedule, start=1):
        for _ in range(50):
            delay = retry_delay(tries, schedule, 0.2, rand)
            assert base <= delay <= base * 1.2
    assert retry_delay(4, schedule, 0.2, rand) is None
    assert retry_delay(1, schedule, 0.0) == 5


def test_retry_schedule__the_default_is_standard_webhooks_about_27_hours():
    schedule = DEFAULTS["WEBHOOK_RETRY_SECONDS"]
    assert schedule == [5, 300, 1800, 7200, 18000, 36000, 36000]
    assert 27.5 * 3600 < total_seconds(schedule) < 27.7 * 3600


def resolver(table: dict[str, list[str]]):
    def resolve(host: str, port: int) -> list[str]:
        if host not in table:
            raise OSError("no such host")
        return table[host]

    return resolve


DNS = resolver(
    {
        "hooks.example.com": ["93.184.216.34"],
        "local.test": ["127.0.0.1"],
        "lan.test": ["10.1.2.3"],
        "metadata.test": ["169.254.169.254"],
        "mixed.test": ["93.184.216.34", "192.168.1.5"],
        "mapped.test": ["::ffff:127.0.0.1"],
        "v6.test": ["2606:4700::1111"],
    }
)


@pytest.mark.parametrize("host", ["hooks.example.com", "v6.test"])
def test_check__public_addresses_pass(host):
    assert check(f"https://{host}/hook", resolver=DNS)


@pytest.mark.parametrize(
    "url",
    [
        "http://local.test/hook",
        "http://lan.test/hook",
        "http://metadata.test/latest",
        "http://mixed.test/hook",
        "http://mapped.test/hook",
        "http://127.0.0.1:8000/hook",
        "http://[::1]/hook",
        "http://0.0.0.0/hook",
    ],
)
def test_check__private_loopback_link_local_and_reserved_are_refused(url):
    dns = resolver({"127.0.0.1": ["127.0.0.1"], "::1": ["::1"], "0.0.0.0": ["0.0.0.0"]})
    with pytest.raises(UrlRefused):
        check(url, resolver=lambda h, p: DNS(h, p) if h.endswith("test") else dns(h, p))


@pytest.mark.parametrize("url", ["ftp://hooks.example.com/x", "file:///etc/passwd", "/hook"])
def test_check__only_http_and_https(url):
    with pytest.raises(UrlRefused):
        check(url, resolver=DNS)


def test_check__an_unknown_host_is_refused():
    with pytest.raises(UrlRefused, match="Cannot resolve"):
        check("https://nowhere.test/hook", resolver=DNS)


def test_check__allowed_by_host_name_or_network():
    assert check("http://local.test/hook", ["local.test"], resolver=DNS) == []
    assert check("http://lan.test/hook", ["10.0.0.0/8"], resolver=DNS) == ["10.1.2.3"]
    with pytest.raises(UrlRefused):
        check("http://mixed.test/hook", ["10.0.0.0/8"], resolver=DNS)


def test_pinned__the_request_goes_to_a_checked_address_under_its_name():
    # DNS rebinding: the name is not resolved again when the client connects.
    assert pinned("https://hooks.example.com/in?x=1", ["93.184.216.34"]) == (
        "https://93.184.216.34/in?x=1",
        {"host": "hooks.example.com"},
        {"sni_hostname": "hooks.example.com"},
    )
    assert pinned("http://user:pw@hooks.example.com:8080/in", ["2606:2800:220:1::"]) == (
        "http://user:pw@[2606:2800:220:1::]:8080/in",
        {"host": "hooks.example.com:8080"},
        {},
    )
    # Allowed by name: connected to by name (what the host's own resolver says).
    assert pinned("http://local.test/hook", []) == ("http://local.test/hook", {}, {})


def test_problems__a_good_subscription_has_none_and_mistakes_are_named():
    good = {"name": "ops", "url": "https://h.example/x", "secret": SECRET, "events": ["*"]}
    assert problems([good]) == []
    found = problems(
        [
            good,
            {**good, "url": "ftp://h.example/x"},
            {**good, "name": "b", "secret": "not base64!"},
            {**good, "name": "c", "events": ["run.exploded"]},
            {"name": "d"},
        ]
    )
    assert len(found) == 5, found
    assert "used twice" in found[0] and "http(s)" in found[1]
    assert "secret" in found[2] and "run.exploded" in found[3] and "lacks url" in found[4]
    assert problems("nope") and problems([1])
