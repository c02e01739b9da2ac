"""``GET /v1/models/{id}``: one model of the pool by name or alias (an id with
a ``/`` as is or percent-encoded), 404 ``model_not_found`` in OpenAI's error
envelope otherwise; ``GET /v1/models`` lists the same objects."""

from __future__ import annotations

from .test_multipool import multi, publish_fleet  # noqa: F401  (fixture)
from .test_router import Env, env  # noqa: F401  (fixture)


async def test_one_model_by_name_and_by_alias(env: Env) -> None:  # noqa: F811
    listing = await (await env.client.get("/v1/models")).json()
    (entry,) = listing["data"]
    assert entry["id"] == "qwen-2.5"
    for path in ("/v1/models/qwen-2.5", "/v1/models/Qwen/Qwen2.5-32B-Instruct",
                 "/v1/models/Qwen%2FQwen2.5-32B-Instruct"):
        r = await env.client.get(path)
        assert r.status == 200, path
        assert await r.json() == entry
    assert entry["max_model_len"] == 32768
    assert entry["aliases"] == ["Qwen/Qwen2.5-32B-Instruct"]
    assert sorted(entry["served_by"]) == ["databricks", "qwen-2-5-32b", "qwen-2-5-32b-spot"]


async def test_an_unknown_model_is_404_model_not_found(env: Env) -> None:  # noqa: F811
    r = await env.client.get("/v1/models/gpt-9")
    assert r.status == 404
    body = await r.json()
    assert body["error"]["code"] == "model_not_found"
    assert body["error"]["type"] == "invalid_request_error"
    assert "'gpt-9'" in body["error"]["message"]
    assert len(body["error"]["decision_id"]) == 32


async def test_other_methods_and_the_bare_prefix(env: Env) -> None:  # noqa: F811
    r = await env.client.post("/v1/models/qwen-2.5", json={})
    assert r.status == 405 and r.headers["Allow"] == "GET, HEAD"
    r = await env.client.get("/v1/models/")
    assert r.status == 404  # the prefix alone names no model: not a route


async def test_one_model_through_the_router_of_several_pools(multi) -> None:  # noqa: F811
    """In Kubernetes mode the pool is the request's route's: /v1/models/{id} too."""
    s, data = multi["session"], multi["data"]
    await publish_fleet(multi)
    async with s.get(f"{data}/v1/models/model-a", headers={"Host": "a.example.com"}) as r:
        assert r.status == 200 and (await r.json())["id"] == "model-a"
    async with s.get(f"{data}/v1/models/model-b", headers={"Host": "a.example.com"}) as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "model_not_found"
    async with s.get(f"{data}/v1/models/model-b", headers={"Host": "z.b.example.com"}) as r:
        assert r.status == 200 and (await r.json())["id"] == "model-b"
    async with s.get(f"{data}/v1/models/model-a", headers={"Host": "nowhere.example.com"}) as r:
        assert r.status == 404 and (await r.json())["error"]["code"] == "route_not_found"


async def test_models_need_a_key_in_api_key_mode(env: Env) -> None:  # noqa: F811
    """The listing names providers (``served_by``): 401 first without a valid key."""
    env.router.auth.mode = "apiKey"
    env.router.auth.set_keys([("alice", "sk-alice")])
    for path in ("/v1/models", "/v1/models/qwen-2.5"):
        r = await env.client.get(path)
        assert r.status == 401 and (await r.json())["error"]["code"] == "unauthorized", path
        r = await env.client.get(path, headers={"Authorization": "Bearer sk-alice"})
        assert r.status == 200, path


async def test_models_of_an_unknown_host_are_401_first(multi) -> None:  # noqa: F811
    await publish_fleet(multi)
    auth = multi["router"].auth
    auth.mode = "apiKey"
    auth.set_keys([("alice", "sk-alice")])
    s, data = multi["session"], multi["data"]
    for host, key, status in (("nowhere.example.com", None, 401), ("nowhere.example.com", "sk-alice", 404),
                              ("a.example.com", None, 401), ("a.example.com", "sk-alice", 200)):
        headers = {"Host": host, **({"Authorization": f"Bearer {key}"} if key else {})}
        for path in ("/v1/models", "/v1/models/model-a"):
            async with s.get(f"{data}{path}", headers=headers) as r:
                assert r.status == status, (host, key, path)
