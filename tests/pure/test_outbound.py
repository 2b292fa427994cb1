"""The outbound address policy (django_agentrun.outbound): public addresses only, by the IANA
special-purpose registries, and every IPv6 form that embeds or routes to an IPv4 address
judged by that address (issue 37: NAT64 reached the metadata service)."""

from __future__ import annotations

import ipaddress

import pytest

from django_agentrun.outbound import UrlRefused, allowed, check, embedded, public

# address -> whether a request may go there. Public addresses first, then each special
# range of the IPv4 registry, then each IPv6 form of an internal IPv4 address.
TABLE: dict[str, bool] = {
    # public
    "93.184.216.34": True,
    "8.8.8.8": True,
    "1.1.1.1": True,
    "2606:4700::1111": True,
    "2a00:1450:4001:82a::200e": True,
    "192.0.0.9": True,  # PCP anycast: globally reachable within 192.0.0.0/24
    "192.0.0.10": True,  # TURN anycast
    "192.31.196.1": True,  # AS112-v4
    "2001:4:112::1": True,  # AS112-v6
    "2001:1::1": True,  # PCP anycast (v6)
    "2001:20::1": True,  # ORCHIDv2
    # public IPv4 inside IPv6 forms
    "::ffff:8.8.8.8": True,
    "64:ff9b::808:808": True,  # NAT64 of 8.8.8.8
    "2002:808:808::1": True,  # 6to4 of 8.8.8.8
    # the IPv4 registry
    "0.0.0.0": False,
    "0.1.2.3": False,
    "10.0.0.1": False,
    "100.64.0.1": False,  # shared address space
    "127.0.0.1": False,
    "127.1.2.3": False,
    "169.254.169.254": False,  # cloud metadata
    "172.16.0.1": False,
    "172.31.255.255": False,
    "192.0.0.1": False,  # IETF protocol assignments
    "192.0.0.8": False,  # IPv4 dummy address
    "192.0.0.170": False,  # NAT64 discovery
    "192.0.2.1": False,
    "192.88.99.1": False,  # deprecated 6to4 relay anycast
    "192.168.1.1": False,
    "198.18.0.1": False,
    "198.51.100.1": False,
    "203.0.113.1": False,
    "224.0.0.1": False,
    "239.255.255.250": False,
    "240.0.0.1": False,
    "255.255.255.255": False,
    # the IPv6 registry
    "::": False,
    "::1": False,
    "fe80::1": False,
    "fc00::1": False,
    "fd12:3456::1": False,
    "fec0::1": False,  # site-local (deprecated)
    "ff02::1": False,
    "100::1": False,  # discard-only
    "2001:db8::1": False,
    "2001:2::1": False,  # benchmarking
    "2001:10::1": False,  # deprecated ORCHID
    "3fff::1": False,  # documentation
    "5f00::1": False,  # segment routing
    "64:ff9b:1::a9fe:a9fe": False,  # local-use NAT64
    "4000::1": False,  # outside global unicast
    # IPv6 forms of internal IPv4 addresses
    "::ffff:127.0.0.1": False,  # IPv4-mapped
    "::ffff:169.254.169.254": False,
    "::ffff:0:7f00:1": False,  # IPv4-translated 127.0.0.1
    "::ffff:0:a9fe:a9fe": False,  # IPv4-translated metadata
    "::127.0.0.1": False,  # IPv4-compatible
    "::10.0.0.1": False,
    "::8.8.8.8": False,  # IPv4-compatible is deprecated: never a place to go
    "64:ff9b::a9fe:a9fe": False,  # NAT64 of 169.254.169.254
    "64:ff9b::7f00:1": False,  # NAT64 of 127.0.0.1
    "64:ff9b::a00:1": False,  # NAT64 of 10.0.0.1
    "2002:a9fe:a9fe::1": False,  # 6to4 of the metadata address
    "2002:7f00:1::1": False,  # 6to4 of 127.0.0.1
    "2002:c0a8:101::1": False,  # 6to4 of 192.168.1.1
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7": True,  # Teredo, server and client (8.8.8.8) public
    "2001:0:a00:1:8000:63bf:3fff:fdd2": False,  # Teredo server 10.0.0.1
    "2001:0:4136:e378:8000:63bf:80ff:fffe": False,  # Teredo client 127.0.0.1
    "2001:4860:4860::5efe:a9fe:a9fe": False,  # ISATAP interface id, metadata address
    "2001:4860:4860::200:5efe:a00:1": False,  # ISATAP (u/l bit), 10.0.0.1
}


def test_table__at_least_forty_addresses_of_every_kind():
    assert len(TABLE) >= 40
    assert sum(TABLE.values()) >= 10 and sum(not v for v in TABLE.values()) >= 40


@pytest.mark.parametrize(("text", "expected"), TABLE.items())
def test_public(text, expected):
    assert public(ipaddress.ip_address(text)) is expected


@pytest.mark.parametrize(
    ("text", "inner"),
    [
        ("64:ff9b::a9fe:a9fe", ["169.254.169.254"]),
        ("2002:a9fe:a9fe::1", ["169.254.169.254"]),
        ("::ffff:0:7f00:1", ["127.0.0.1"]),
        ("::127.0.0.1", ["127.0.0.1"]),
        ("2001:0:a00:1:8000:63bf:3fff:fdd2", ["10.0.0.1", "192.0.2.45"]),
        ("2606:4700::1111", []),
    ],
)
def test_embedded__the_ipv4_addresses_an_ipv6_address_carries(text, inner):
    assert [str(a) for a in embedded(ipaddress.ip_address(text))] == inner


def test_allowed__a_network_allows_the_ipv6_forms_of_its_addresses():
    local = [ipaddress.ip_network("127.0.0.0/8")]
    assert allowed(ipaddress.ip_address("::ffff:127.0.0.1"), local)
    assert allowed(ipaddress.ip_address("127.0.0.1"), local)
    assert not allowed(ipaddress.ip_address("10.0.0.1"), local)


@pytest.mark.parametrize("address", ["64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1", "fec0::1"])
def test_check__a_name_that_resolves_to_an_ipv6_form_of_an_internal_address(address):
    with pytest.raises(UrlRefused, match="not a public address"):
        check("https://hooks.example.com/in", resolver=lambda host, port: [address])
