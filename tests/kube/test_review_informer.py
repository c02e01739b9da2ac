"""An informer survives failures it did not foresee (review of the
Kubernetes mode): an exception of any type in its list/watch loop (the
client's "Malformed JSON response" is a bare Exception, a handler or a
transform may raise) is logged and followed by a relist after the backoff;
the informer never dies silently with a stale cache."""

from __future__ import annotations

import asyncio

from kinference_common.kube import kinds
from kinference_common.kube.client import ResourceClient
from kinference_common.kube.config import api_client
from kinference_common.kube.informer import Informer

G = "kinference.buoyant.io"


def pol(name: str) -> dict:
    return {"apiVersion": f"{G}/v1alpha1", "kind": "InferencePolicy",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"rules": []}}


async def eventually(pred, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not pred():
        assert loop.time() < end, "condition not reached before the deadline"
        await asyncio.sleep(0.02)


async def test_an_unexpected_exception_relists_instead_of_killing_the_informer(kube_api, kubeconfig):
    kube_api.apply(pol("a"))
    api = await api_client(kubeconfig, "kinference-test")
    failures = {"left": 2}

    def transform(obj: dict) -> dict:
        if obj["metadata"]["name"] == "b" and failures["left"]:
            failures["left"] -= 1
            raise RuntimeError("something nobody foresaw")
        return obj

    inf = Informer(ResourceClient(api), kinds.INFERENCE_POLICY, transform=transform, watch_timeout=30,
                   backoff_base=0.02, backoff_cap=0.05)
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        kube_api.apply(pol("b"))  # the watch event's transform fails, then the relist's
        await eventually(lambda: inf.get("default", "b") is not None)
        assert inf.errors >= 1
        kube_api.apply(pol("c"))  # and it is still watching
        await eventually(lambda: inf.get("default", "c") is not None)
    finally:
        await inf.stop()
        await api.close()
    assert all(t.done() for t in inf._tasks) and not inf._tasks


async def test_a_handler_failing_on_the_first_list_does_not_stop_the_watch(kube_api, kubeconfig):
    kube_api.apply(pol("a"))
    api = await api_client(kubeconfig, "kinference-test")
    calls = {"n": 0}

    def on_change() -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            raise KeyError("a handler bug")

    inf = Informer(ResourceClient(api), kinds.INFERENCE_POLICY, on_change=on_change, watch_timeout=30,
                   backoff_base=0.02, backoff_cap=0.05)
    inf.start()
    try:
        await asyncio.wait_for(inf.synced.wait(), 5)
        await eventually(lambda: inf.get("default", "a") is not None)
        kube_api.apply(pol("b"))  # the failed handler did not end the watching
        await eventually(lambda: inf.get("default", "b") is not None)
    finally:
        await inf.stop()
        await api.close()
