"""HTTPRoute header, query parameter and method matches in router mode, with
Gateway API's precedence (after the hostname and the path: a method match,
then more header matches, then more query parameter matches)."""

from __future__ import annotations

from typing import Any

from kinference_common.compiler import compile_documents
from kinference_common.manifests import load_text
from kinference_router.pools import RouteTable

from .test_multipool import fleet

ROUTE = """
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {{name: {name}, namespace: {ns}}}
spec:
  rules:
    - matches: [{match}]
      backendRefs: [{{group: kinference.buoyant.io, kind: InferencePool, name: {ns}-pool}}]
"""


def table(*routes: tuple[str, str]) -> RouteTable:
    text = "\n---\n".join(fleet(ns, "m") + "\n---\n" + ROUTE.format(name=f"r-{ns}", ns=ns, match=match)
                          for ns, match in routes)
    res = compile_documents(load_text(text, "m"))
    assert not res.errors, res.errors
    return RouteTable(res.pools.values())


def pool(t: RouteTable, method: str = "POST", headers: dict[str, str] | None = None, query: str = "") -> Any:
    key = t.match("any", "/v1/chat/completions", method, headers or {}, query)
    return key[0] if key else None


def test_header_query_and_method_matches_with_precedence() -> None:
    t = table(("plain", "{path: {value: /v1}}"),
              ("gold", "{path: {value: /v1}, headers: [{name: X-Tier, value: gold}]}"),
              ("gold-eu", "{path: {value: /v1}, headers: [{name: x-tier, value: gold}, "
                          "{name: X-Region, type: RegularExpression, value: 'eu-.*'}]}"),
              ("beta", "{path: {value: /v1}, queryParams: [{name: beta, value: '1'}]}"),
              ("get", "{path: {value: /v1}, method: GET}"))
    assert pool(t) == "plain"
    assert pool(t, headers={"x-tier": "gold"}) == "gold"
    assert pool(t, headers={"x-tier": "gold", "x-region": "eu-west"}) == "gold-eu"  # more headers first
    assert pool(t, headers={"x-tier": "gold", "x-region": "us-east"}) == "gold"  # the regex matches in full only
    assert pool(t, headers={"x-tier": "silver"}) == "plain"
    assert pool(t, query="beta=1") == "beta"
    assert pool(t, headers={"x-tier": "gold"}, query="beta=1") == "gold"  # headers before query parameters
    assert pool(t, method="GET", headers={"x-tier": "gold"}) == "get"  # a method before headers
    assert pool(t, method="GET") == "get"


def test_the_compiled_route_carries_the_matches() -> None:
    res = compile_documents(load_text(fleet("a", "m") + "\n---\n" + ROUTE.format(
        name="r", ns="a", match="{method: POST, headers: [{name: X-Tier, value: gold}]}"), "m"))
    [route] = res.pools[("a", "a-pool")].routes
    [m] = route.paths
    assert m.method == "POST" and [(h.name, h.value, h.type) for h in m.headers] == [("x-tier", "gold", "Exact")]
