"""End to end through a real Envoy: the local stack (``make run-envoy``: the
router also serving its Endpoint Picker and provider egress, simulated vLLM
pods, classifier, provider simulator) with Envoy in front, plus extra Envoys
rendered by :mod:`kinference_simulators.envoy` for the gateway-side modes.

One stack for the module (started once, ~15 s). Which pod served a request
is read from the pods themselves (``vllm:request_success_total``), the
policy's pick from the decision event on NATS, never from what the EPP says.
Also the GIE conformance tests that apply to an EPP, with Kinference standing
in for the suite's EPP (``--epp-conformance-hooks``).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import nats
import pytest
import pytest_asyncio

from kinference_common import natsserver
from kinference_simulators import envoy
from kinference_simulators.stack import ENVOY_PORTS, PODS, Proc, Stack

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(240)]

PII = "My card is 4111 1111 1111 1111 and my email is jane.doe@example.com, please summarise my account."
CLEAN = "Write two sentences about the history of tea."
HOOK = "test-epp-endpoint-selection"
SERVED = "x-conformance-test-served-endpoint"

EXTRA_MANIFESTS = """
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {name: spot-only, namespace: default}
spec:
  destinations:
    - { kind: InferenceWorkerSet, name: qwen-2-5-32b-spot }
  policyRef: {name: burst-unless-pii}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {name: never-capacity, namespace: default}
spec:
  rules:
    - name: always-full
      route:
        exclude:
          - name: every-pod-is-full
            drop:
              backend: { type: Local }
              queuedPrompts: { lessThan: 1000000 }
        select:
          - { type: Local, minimize: PredictedTTFT }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {name: no-pods, namespace: default}
spec:
  destinations:
    - { kind: InferenceWorkerSet, name: qwen-2-5-32b }
  policyRef: {name: never-capacity}
  flowControl: {maxQueued: 1, maxQueueWait: 400ms}
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePolicy
metadata: {name: to-the-provider, namespace: default}
spec:
  rules:
    - name: provider-only
      route:
        select:
          - { type: Provider, order: [databricks] }
---
apiVersion: kinference.buoyant.io/v1alpha1
kind: InferencePool
metadata: {name: provider-only, namespace: default}
spec:
  destinations:
    - { kind: InferenceProvider, name: databricks }
  policyRef: {name: to-the-provider}
"""


class Rig:
    """The stack, its pods by address, and the decision events seen."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.pods = {pod: f"127.0.0.1:{stack.port(port)}" for _ws, pod, port in PODS}
        self.events: dict[str, dict[str, Any]] = {}
        self.extra: dict[str, int] = {}  # extra router pools -> EPP port
        self.extra_data: dict[str, int] = {}  # extra router pools -> data port
        self.extra_egress: dict[str, int] = {}  # extra router pools -> egress port (0: none)
        self.envoys: list[envoy.EnvoyProcess] = []

    @property
    def envoy_url(self) -> str:
        return f"http://127.0.0.1:{self.stack.port(ENVOY_PORTS['envoy'])}"

    @property
    def data_url(self) -> str:
        """The router's own data port (the other front door)."""
        return f"http://127.0.0.1:{self.stack.port(8080)}"

    def port(self) -> int:
        """A free port for an extra Envoy or router."""
        return natsserver.free_port()

    async def served_counts(self) -> dict[str, float]:
        out = {}
        async with aiohttp.ClientSession() as http:
            for pod, addr in self.pods.items():
                try:
                    async with http.get(f"http://{addr}/metrics") as r:
                        text = await r.text()
                except aiohttp.ClientError:
                    text = ""  # down
                # served = finished by stop or length; an abort (its client went
                # away before the end) is counted apart and is not a serve
                out[pod] = sum(float(m.group(2)) for m in re.finditer(
                    r'^vllm:request_success_total\{([^}]*)\} ([0-9.e+]+)$', text, re.M)
                    if 'finished_reason="abort"' not in m.group(1))
        return out

    async def settled_counts(self) -> dict[str, float]:
        """``served_counts`` once no earlier request is still to be counted: a
        pod counts a request at the engine step that finishes it, which can
        come after its client read the answer, so a count read right after the
        previous test can miss that test's last request (seen in CI: 21 served
        of 20). Two reads 0.1 s apart that agree, or what there is after 3 s."""
        last = await self.served_counts()
        for _ in range(30):
            await asyncio.sleep(0.1)
            now = await self.served_counts()
            if now == last:
                break
            last = now
        return last

    async def event(self, decision_id: str) -> dict[str, Any]:
        for _ in range(50):
            if decision_id in self.events:
                return self.events[decision_id]
            await asyncio.sleep(0.05)
        raise AssertionError(f"no decision event for {decision_id}")

    def extra_envoy(self, cfg: envoy.EnvoyConfig, name: str) -> envoy.EnvoyProcess:
        e = envoy.EnvoyProcess(cfg, self.stack.run_dir, name).start()
        self.envoys.append(e)
        return e

    def pool(self, **kw: Any) -> envoy.Pool:
        """The stack's pool as a gateway sees it (its EPP, pods and egress)."""
        return envoy.Pool(**{"epp": f"127.0.0.1:{self.stack.port(ENVOY_PORTS['epp'])}",
                             "endpoints": list(self.pods.values()),
                             "egress": f"127.0.0.1:{self.stack.port(ENVOY_PORTS['egress'])}", **kw})


async def _extra_router(stack: Stack, pool: str, *, egress: bool = False) -> tuple[int, int, int]:
    """Another router (another pool's EPP, and with ``egress`` its provider
    egress) with the stack's NATS credentials: its EPP, data and egress ports."""
    base = stack.proc("router").argv
    argv, skip = [], False
    drop = {"--pool", "--port", "--admin-port", "--epp-port", "--egress-port"}
    for a in base:
        if skip:
            skip = False
            continue
        if a in drop:
            skip = True
            continue
        argv.append(a)
    port, admin, epp, egress_port = (natsserver.free_port() for _ in range(4))
    proc = Proc(f"router-{pool}", [*argv, "--pool", f"default/{pool}", "--port", str(port), "--admin-port",
                                  str(admin), "--epp-port", str(epp), "--epp-fallbacks", "0",
                                  *(["--egress-port", str(egress_port)] if egress else [])],
                ready_url=f"http://127.0.0.1:{port}/readyz")
    await stack.spawn(proc)
    stack.procs.insert(len(stack.procs) - 1, proc)
    await stack._wait_ready(proc, 60)
    return epp, port, egress_port if egress else 0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rig(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Rig]:
    offset = 14000 + (os.getpid() % 30) * 100  # below the ephemeral range; varied per process
    s = Stack(tmp_path_factory.mktemp("gw") / "run", offset, envoy=True, router_args=["--epp-conformance-hooks"])
    s.prepare()
    (s.run_dir / "manifests" / "90-gateway-test.yaml").write_text(EXTRA_MANIFESTS)
    await s.start("a10g", 1.0, timeout=90)
    stop = asyncio.Event()
    supervisor = asyncio.create_task(s.supervise(stop, initial=0.2, say=lambda *a, **k: None))
    rig = Rig(s)
    nc = await nats.connect(f"nats://127.0.0.1:{s.port(4222)}", user="observer",
                            password=(s.run_dir / "nats-auth" / "observer").read_text().strip())

    async def on_event(msg: Any) -> None:
        ev = json.loads(msg.data)
        rig.events[ev["decision_id"]] = ev

    await nc.subscribe("kinference.decisions.>", cb=on_event)
    try:
        for pool in ("spot-only", "no-pods", "provider-only"):
            rig.extra[pool], rig.extra_data[pool], rig.extra_egress[pool] = await _extra_router(
                s, pool, egress=pool == "provider-only")
        await _wait_local(rig)
        yield rig
    finally:
        for e in rig.envoys:
            e.stop()
        stop.set()
        await supervisor
        await nc.close()
        await s.stop()


async def post(url: str, body: dict[str, Any], headers: dict[str, str] | None = None,
               timeout: float = 60, path: str = "/v1/chat/completions") -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as http, \
            http.post(f"{url}{path}", json=body, headers=headers or {}) as r:
        return r.status, {k.lower(): v for k, v in r.headers.items()}, await r.read()


def chat(content: str = CLEAN, **kw: Any) -> dict[str, Any]:
    return {"model": "qwen-2.5", "max_tokens": 4, "messages": [{"role": "user", "content": content}], **kw}


async def _wait_local(rig: Rig) -> None:
    """The EPP routes to pods (it has telemetry), through Envoy."""
    for _ in range(150):
        status, h, _ = await post(rig.envoy_url, chat())
        if status == 200 and h.get("x-kinference-backend", "").startswith("Local/"):
            return
        await asyncio.sleep(0.2)
    raise AssertionError("the stack never routed through Envoy")


async def burst(url: str, n: int, headers: dict[str, str] | None = None, body: dict[str, Any] | None = None,
                at_once: int = 4) -> list[int]:
    """``n`` requests, ``at_once`` at a time; a 503 (the pinned pod's queue
    is over the policy's limit on a slow machine) is tried again, as the
    conformance suite retries 503 as gateway convergence."""
    out: list[int] = []
    while len(out) < n:
        for _ in range(20):
            got = await asyncio.gather(*(post(url, body or chat(), headers) for _ in range(min(at_once, n - len(out)))))
            statuses = [st for st, _, _ in got]
            if 503 not in statuses:
                break
            out += [st for st in statuses if st != 503]
            await asyncio.sleep(0.2)
        out += statuses
    return out


async def served_by(rig: Rig, before: dict[str, float], count: int = 1) -> list[str]:
    """The pods that served since ``before``, once ``count`` requests are
    counted (a pod counts a stream after its last chunk is written, which
    can be after the client read it), or after 3 s with what there is."""
    for _ in range(60):
        after = await rig.served_counts()
        served = [pod for pod in after for _ in range(int(after[pod] - before[pod]))]
        if len(served) >= count:
            break
        await asyncio.sleep(0.05)
    return served


# ------------------------------------------------------------- the pick


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_the_policys_pick_is_the_pod_that_answers(rig: Rig, stream: bool) -> None:
    for _ in range(3):
        before = await rig.settled_counts()
        status, h, body = await post(rig.envoy_url, chat(stream=stream))
        assert status == 200, body
        ev = await rig.event(h["x-kinference-decision-id"])
        assert ev["outcome"]["type"] == "Routed"
        assert await served_by(rig, before) == [ev["outcome"]["endpoint"]]
        # the pod was sent its served name; the client gets back the name it asked for
        assert ev["outcome"]["model"] == "Qwen/Qwen2.5-32B-Instruct"
        if stream:
            assert h["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) for line in body.decode().splitlines()
                      if line.startswith("data: {")]
            assert events and {e["model"] for e in events} == {"qwen-2.5"}
            assert body.rstrip().endswith(b"data: [DONE]")
        else:
            assert json.loads(body)["model"] == "qwen-2.5"


async def test_model_rewrite_seen_by_the_pod_undone_for_the_client(rig: Rig) -> None:
    # the pods answer 404 to the client's name: a 200 means the pod saw the served name
    status, _, body = await post(f"http://{rig.pods['qwen-0']}", chat())
    assert status == 404
    status, h, body = await post(rig.envoy_url, chat())
    assert status == 200 and json.loads(body)["model"] == "qwen-2.5"


# ---------------------------------------------------- conformance (GIE)


async def test_conformance_gateway_following_epp_routing(rig: Rig) -> None:
    """GatewayFollowingEPPRouting: the EPP (by the test header) picks 1, then
    2 pods; every request at concurrency 10 lands on those only."""
    for picked in (["qwen-1"], ["qwen-0", "qwen-spot-0"]):
        before = await rig.settled_counts()
        hook = {HOOK: ",".join(rig.pods[p] for p in picked)}
        assert await burst(rig.envoy_url, 20, hook) == [200] * 20
        served = await served_by(rig, before, 20)
        assert len(served) == 20 and set(served) <= set(picked), served


async def test_conformance_gateway_destination_endpoint_served(rig: Rig) -> None:
    """GatewayDestinationEndpointServed: the served endpoint comes back (Envoy
    filled envoy.lb/x-gateway-destination-endpoint-served) and is the pod that served."""
    for pod in ("qwen-0", "qwen-spot-0"):
        before = await rig.settled_counts()
        status, h, _ = await post(rig.envoy_url, chat(), {HOOK: rig.pods[pod]})
        assert status == 200
        assert h[SERVED] == rig.pods[pod]
        assert await served_by(rig, before) == [pod]


async def test_client_sent_destination_headers_are_ignored(rig: Rig) -> None:
    before = await rig.settled_counts()
    forged = {"x-gateway-destination-endpoint": rig.pods["qwen-spot-0"], "x-kinference-egress": "forged",
              HOOK: rig.pods["qwen-1"]}
    status, h, _ = await post(rig.envoy_url, chat(), forged)
    assert status == 200 and await served_by(rig, before) == ["qwen-1"]


async def test_conformance_two_pools_on_two_route_rules(rig: Rig) -> None:
    """HTTPRouteMultipleRulesDifferentPools: a header rule to pool spot-only
    (its own EPP), the catch-all to inference-all; each lands in its own pool."""
    cfg = envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True, pools=[
        rig.pool(),
        envoy.Pool(epp=f"127.0.0.1:{rig.extra['spot-only']}", endpoints=[rig.pods["qwen-spot-0"]],
                   headers={"x-route": "spot"}, name="spot")])
    e = rig.extra_envoy(cfg, "envoy-two-pools")
    before = await rig.settled_counts()
    assert await burst(e.url, 6, {"x-route": "spot"}, at_once=2) == [200] * 6
    assert await served_by(rig, before, 6) == ["qwen-spot-0"] * 6
    status, h, _ = await post(e.url, chat(), {"x-route": "spot"})
    assert status == 200 and (await rig.event(h["x-kinference-decision-id"]))["pool"] == "default/spot-only"
    status, h, _ = await post(e.url, chat(), {HOOK: rig.pods["qwen-0"]})
    assert status == 200 and (await rig.event(h["x-kinference-decision-id"]))["pool"] == "default/inference-all"


# ------------------------------------- the two front doors answer alike


def stream_models(body: bytes) -> set[str]:
    """The ``model`` of every event of a streamed answer that has one."""
    return {e["model"] for e in (json.loads(line[6:]) for line in body.decode().splitlines()
                                 if line.startswith("data: {")) if "model" in e}


async def test_both_doors_give_back_the_clients_model_name(rig: Rig) -> None:
    for url in (rig.envoy_url, rig.data_url):
        status, h, body = await post(url, chat())
        assert status == 200 and h["x-kinference-backend"].startswith("Local/"), body
        assert json.loads(body)["model"] == "qwen-2.5", url
        assert not [k for k in h if k.lower().startswith("x-gateway")], (url, h)  # no pod address shown
        status, h, body = await post(url, chat(stream=True))
        assert status == 200 and stream_models(body) == {"qwen-2.5"}, (url, body)


async def test_a_provider_stream_has_usage_only_when_asked_at_both_doors(rig: Rig) -> None:
    """A pool whose only rule routes to the provider: through Envoy (EPP,
    then the router's egress) as through the data port, a stream carries the
    usage event only when the client asked, and the client's model name."""
    e = rig.extra_envoy(envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True, pools=[
        envoy.Pool(epp=f"127.0.0.1:{rig.extra['provider-only']}", endpoints=[rig.pods["qwen-0"]],
                   egress=f"127.0.0.1:{rig.extra_egress['provider-only']}")]), "envoy-provider-only")
    completion = {"model": "qwen-2.5", "max_tokens": 3, "stream": True, "prompt": "hi there"}
    for url in (e.url, f"http://127.0.0.1:{rig.extra_data['provider-only']}"):
        for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat(stream=True))):
            status, h, got = await post(url, body, path=path)
            assert status == 200 and h["x-kinference-backend"] == "Provider/databricks", (url, got)
            assert b'"usage"' not in got and got.rstrip().endswith(b"data: [DONE]"), (url, path, got)
            assert stream_models(got) == {"qwen-2.5"}, (url, path, got)
        status, _, got = await post(url, chat(stream=True, stream_options={"include_usage": True}))
        assert status == 200 and b'"usage"' in got, (url, got)
        status, _, got = await post(url, chat())
        assert status == 200 and json.loads(got)["model"] == "qwen-2.5", (url, got)


async def test_a_pods_refusal_is_the_routers_envelope_at_both_doors(rig: Rig) -> None:
    """A pod refuses (a prompt plus max_tokens over its window; a prompt list
    it does not take): through Envoy as through the data port, the router's
    envelope with the decision id and the mapped code, never the pod's own."""
    cases = [("/v1/chat/completions", chat("hi", max_tokens=32760), "context_length_exceeded"),
             ("/v1/completions", {"model": "qwen-2.5", "max_tokens": 3, "prompt": ["hi there", "and you"]}, None)]
    for path, body, code in cases:
        answers = [await post(url, body, path=path) for url in (rig.envoy_url, rig.data_url)]
        errors = []
        for status, h, got in answers:
            err = json.loads(got)["error"]
            assert 400 <= status < 500 and err["type"] == "invalid_request_error", (path, status, got)
            assert err["decision_id"] == h["x-kinference-decision-id"] and h["x-kinference-backend"], (path, h)
            assert "param" not in err and err["code"] != 400, got  # not the pod's envelope
            assert not [k for k in h if k.lower().startswith("x-gateway")], (path, h)  # no pod address shown
            errors.append((status, err["code"], err["message"]))
        assert errors[0] == errors[1], (path, errors)
        if code is not None:
            assert errors[0][1] == code, errors


async def test_a_wrong_method_is_405_at_both_doors(rig: Rig) -> None:
    async with aiohttp.ClientSession() as http:
        for method, path in (("POST", "/v1/models"), ("GET", "/v1/chat/completions"), ("GET", "/v1/completions"),
                             ("DELETE", "/v1/models/qwen-2.5")):
            answers = []
            for url in (rig.envoy_url, rig.data_url):
                async with http.request(method, f"{url}{path}", json={} if method == "POST" else None) as r:
                    err = (await r.json())["error"]
                    answers.append((r.status, r.headers.get("Allow"), err["code"], err["message"]))
            assert answers[0] == answers[1] and answers[0][0] == 405, (method, path, answers)


# ------------------------------------------------------ the gateway side


async def test_subset_hint_is_honoured_and_an_empty_one_is_503(rig: Rig) -> None:
    only = rig.extra_envoy(envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True,
                                             pools=[rig.pool()], subset=[rig.pods["qwen-1"]]), "envoy-subset")
    before = await rig.settled_counts()
    assert await burst(only.url, 6, at_once=2) == [200] * 6
    assert await served_by(rig, before, 6) == ["qwen-1"] * 6
    none = rig.extra_envoy(envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True,
                                             pools=[rig.pool()], subset=["10.255.0.1:8000"]), "envoy-subset-none")
    status, h, body = await post(none.url, chat())
    assert status == 503
    err = json.loads(body)["error"]
    assert err["code"] == "no_capacity" and "subset" in err["message"]


async def test_429_and_503_immediate_responses(rig: Rig) -> None:
    """A pool whose policy never finds capacity, flow control maxQueued 1: of
    two requests at once one is shed (429), the other waits maxQueueWait (503)."""
    e = rig.extra_envoy(envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True, pools=[
        envoy.Pool(epp=f"127.0.0.1:{rig.extra['no-pods']}", endpoints=[rig.pods["qwen-0"]])]), "envoy-no-pods")
    results = await asyncio.gather(post(e.url, chat()), post(e.url, chat()))
    assert sorted(s for s, _, _ in results) == [429, 503], results
    for status, h, body in results:
        err = json.loads(body)["error"]
        assert err["code"] == ("rate_limited" if status == 429 else "no_capacity")
        assert h["content-type"] == "application/json" and "retry-after" in h


async def test_epp_unavailable_fail_open_and_fail_close(rig: Rig) -> None:
    """EppUnAvailableFailOpen: phase 1 the EPP pins a pod; phase 2 the EPP is
    unreachable and a FailOpen pool still answers 200 from a pod (the suite's
    requests have no body; Envoy 1.40 cannot fail open once a request body
    streamed in FULL_DUPLEX_STREAMED mode: it answers 500, see
    docs/envoy.md); FailClose answers 5xx."""
    dead = f"127.0.0.1:{rig.port()}"
    pinned = rig.extra_envoy(envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True,
                                               pools=[rig.pool(fail_open=True)]), "envoy-failopen-live")
    before = await rig.settled_counts()
    status, h, _ = await post(pinned.url, chat(), {HOOK: rig.pods["qwen-spot-0"]})
    assert status == 200 and await served_by(rig, before) == ["qwen-spot-0"]

    fail_open = rig.extra_envoy(envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True,
                                                  pools=[rig.pool(epp=dead, fail_open=True)]), "envoy-failopen")
    fail_close = rig.extra_envoy(envoy.EnvoyConfig(port=rig.port(), admin_port=rig.port(), fallback=True,
                                                   pools=[rig.pool(epp=dead, fail_open=False)]), "envoy-failclose")
    async with aiohttp.ClientSession() as http:
        for _ in range(6):
            async with http.get(f"{fail_open.url}/v1/models") as r:
                assert r.status == 200
                # a pod answered (the EPP would answer from the pool's model list: "qwen-2.5")
                assert [m["id"] for m in (await r.json())["data"]] == ["Qwen/Qwen2.5-32B-Instruct"]
        async with http.get(f"{fail_close.url}/v1/models") as r:
            assert 500 <= r.status <= 504
    status, _, _ = await post(fail_close.url, chat())
    assert 500 <= status <= 504


async def test_pii_in_any_field_under_saturation_never_reaches_the_provider(rig: Rig) -> None:
    """Saturate the pods through Envoy: clean prompts burst to the provider
    (through the router's egress), PII (in the message, the name or a tool
    argument) never does."""
    log = rig.stack.run_dir / "provider-requests.jsonl"
    placements = [
        lambda: chat(PII * 20, max_tokens=200),
        lambda: {**chat(CLEAN * 20, max_tokens=200), "user": PII},
        lambda: {"model": "qwen-2.5", "max_tokens": 200, "messages": [
            {"role": "user", "content": CLEAN * 20},
            {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
                "name": "lookup", "arguments": json.dumps({"note": PII})}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"}]},
    ]
    results: list[tuple[int, dict[str, str], bytes]] = []
    for _ in range(3):
        batch = [placements[i % 3]() if i % 2 else chat(CLEAN * 20, max_tokens=200) for i in range(90)]
        results += await asyncio.gather(*(post(rig.envoy_url, b) for b in batch))
        if any(h.get("x-kinference-backend") == "Provider/databricks" for _s, h, _b in results):
            break
    assert any(h.get("x-kinference-backend") == "Provider/databricks" for _s, h, _b in results), \
        "nothing burst to the provider"
    assert {s for s, _, _ in results} <= {200, 503}
    received = log.read_text() if log.exists() else ""
    assert received, "the provider simulator logged nothing"
    assert "4111 1111 1111 1111" not in received and "jane.doe@example.com" not in received


# ---------------------------------------------------- failure of the EPP


async def test_dead_first_endpoint_falls_to_the_next_of_the_list(rig: Rig) -> None:
    """override_host: the EPP names pick,fallback,...; the pick refuses
    connections; Envoy's retry takes the next one. The collector is frozen so
    that the EPP still believes in the dead pod: the pod killed is the one the
    router's explain (a dry run on the same snapshot) says it would pick."""
    stack = rig.stack
    prompt = chat("Tell me about lighthouses, in one line.")
    collector = stack.proc("telemetry-collector").process
    assert collector is not None
    collector.send_signal(signal.SIGSTOP)
    pod = None
    try:
        await asyncio.sleep(0.3)  # the last scrape published
        async with aiohttp.ClientSession() as http, \
                http.post(f"http://127.0.0.1:{stack.port(8081)}/debug/explain", json=prompt) as r:
            first = (await r.json())["outcome"]["endpoint"]
        pod = stack.proc(f"vllm-{first}")
        pod.held = True
        await stack.kill(f"vllm-{first}")
        status, h, body = await post(rig.envoy_url, prompt)
        assert status == 200, body
        assert (await rig.event(h["x-kinference-decision-id"]))["outcome"]["endpoint"] == first  # the dead pod
        assert h[SERVED] != rig.pods[first] and h[SERVED] in rig.pods.values()  # served by the next one
    finally:
        collector.send_signal(signal.SIGCONT)
        if pod is not None:
            pod.held = False
    for _ in range(100):  # the supervisor restarts it
        if pod.process is not None and pod.process.returncode is None:
            break
        await asyncio.sleep(0.1)


async def test_kill_9_of_the_epp_mid_load_and_its_restart(rig: Rig) -> None:
    """kill -9 of the router (the EPP) under load: FailClose answers 5xx while
    it is down, never a wrong 200; once the supervisor restarted it, 200 again."""
    stack = rig.stack
    statuses: list[int] = []
    stop = asyncio.Event()

    async def load() -> None:
        while not stop.is_set():
            s, _, _ = await post(rig.envoy_url, chat(), timeout=30)
            statuses.append(s)

    workers = [asyncio.create_task(load()) for _ in range(4)]
    await asyncio.sleep(1.0)
    await stack.kill("router")
    t0 = time.monotonic()
    await asyncio.sleep(1.0)
    stop.set()
    await asyncio.gather(*workers)
    assert 200 in statuses and set(statuses) <= {200, 500, 502, 503, 504}, statuses
    assert any(s >= 500 for s in statuses)
    for _ in range(300):  # restarted and ready again
        status, _, _ = await post(rig.envoy_url, chat(), timeout=10)
        if status == 200:
            break
        await asyncio.sleep(0.1)
    assert status == 200, f"not back {time.monotonic() - t0:.1f}s after the kill"
    assert stack.proc("router").restarts >= 1
