"""Provider aggregation from observations, with an explicit clock."""

from __future__ import annotations

import math

import pytest

from kinference_collector.providers import ProviderAggregator, ProviderConfig
from kinference_common.messages import Observation


def obs(outcome: str = "ok", ttft: float | None = 1.0, name: str = "databricks",
        backend_type: str = "Provider", timeout: float | None = None) -> Observation:
    return Observation(decision_id="d", namespace="ns", pool="pool", backend_type=backend_type,  # type: ignore[arg-type]
                       backend_name=name, outcome=outcome, ttft_seconds=ttft,  # type: ignore[arg-type]
                       timeout_seconds=timeout)


KEY = ("ns", "databricks")


def test_local_observations_are_ignored() -> None:
    agg = ProviderAggregator()
    assert agg.observe(obs(backend_type="Local", name="llama"), 0.0) is None
    assert agg.keys() == []


def test_estimate_is_geometric_mean_of_simultaneous_samples() -> None:
    agg = ProviderAggregator()
    agg.observe(obs(ttft=0.5), 10.0)
    agg.observe(obs(ttft=2.0), 10.0)
    st = agg.state(KEY, 10.0)
    assert st.estimated_ttft_seconds == pytest.approx(1.0)
    assert st.error_rate == 0.0 and st.observations == 2 and st.updated_at == 10.0


def test_recent_samples_weigh_more() -> None:
    agg = ProviderAggregator(ProviderConfig(tau=10.0))
    agg.observe(obs(ttft=1.0), 0.0)
    agg.observe(obs(ttft=4.0), 10.0)
    # weights: old e^-1, new 1
    w_old = math.exp(-1)
    expected = math.exp((w_old * math.log(1.0) + math.log(4.0)) / (w_old + 1))
    assert agg.state(KEY, 10.0).estimated_ttft_seconds == pytest.approx(expected)


def test_timeouts_count_at_the_timeout() -> None:
    agg = ProviderAggregator(ProviderConfig(default_timeout=30.0))
    agg.observe(obs(outcome="timeout", ttft=None, timeout=8.0), 0.0)
    assert agg.state(KEY, 0.0).estimated_ttft_seconds == pytest.approx(8.0)
    agg2 = ProviderAggregator(ProviderConfig(default_timeout=30.0))
    agg2.observe(obs(outcome="timeout", ttft=None), 0.0)
    assert agg2.state(KEY, 0.0).estimated_ttft_seconds == pytest.approx(30.0)


def test_error_rate_over_last_minute() -> None:
    agg = ProviderAggregator()
    agg.observe(obs(outcome="error", ttft=None), 0.0)
    agg.observe(obs(outcome="rate_limited", ttft=None), 30.0)
    agg.observe(obs(outcome="ok"), 30.0)
    agg.observe(obs(outcome="cancelled", ttft=None), 30.0)  # neither
    assert agg.state(KEY, 30.0).error_rate == pytest.approx(2 / 3)
    st = agg.state(KEY, 61.0)  # the first error left the window
    assert st.error_rate == pytest.approx(1 / 2) and st.observations == 2
    st = agg.state(KEY, 200.0)
    assert st.error_rate is None and st.observations == 0
    assert st.estimated_ttft_seconds == pytest.approx(1.0)  # the estimate outlives the window


def test_no_sample_for_an_hour_means_no_estimate() -> None:
    agg = ProviderAggregator()
    agg.observe(obs(ttft=0.7), 0.0)
    assert agg.state(KEY, 3599.0).estimated_ttft_seconds == pytest.approx(0.7)
    assert agg.state(KEY, 3601.0).estimated_ttft_seconds is None
    agg.observe(obs(ttft=0.2), 4000.0)  # decayed to nothing: the new sample dominates
    assert agg.state(KEY, 4000.0).estimated_ttft_seconds == pytest.approx(0.2, rel=1e-6)


def test_errors_without_ttft_are_not_samples() -> None:
    agg = ProviderAggregator()
    agg.observe(obs(outcome="error", ttft=None), 0.0)
    st = agg.state(KEY, 0.0)
    assert st.estimated_ttft_seconds is None and st.error_rate == 1.0


def test_prune_forgets_long_silent_providers() -> None:
    agg = ProviderAggregator(ProviderConfig(max_age=100.0))
    agg.observe(obs(name="a"), 0.0)
    agg.observe(obs(name="b"), 150.0)
    assert agg.prune(199.0) == []
    assert agg.prune(201.0) == [("ns", "a")]
    assert agg.keys() == [("ns", "b")]


def test_routers_key_reports_replace_each_other_and_expire() -> None:
    from kinference_collector.kube_status import provider_status
    from kinference_collector.providers import ProviderKeyReports
    from kinference_common.messages import ProviderKey, ProviderKeyReport

    def report(router: str, problem: str | None, at: float) -> ProviderKeyReport:
        key = ProviderKey(namespace="ns", name="databricks", secret="ns/token", problem=problem,
                          message="secret ns/token: not watched" if problem else "")
        return ProviderKeyReport(router=router, sent_at=at, interval=10.0, providers=[key])

    keys = ProviderKeyReports()
    assert keys.problem("ns", "databricks", 0.0) is None
    keys.receive(report("router-a", "SecretNotWatched", 0.0), 0.0)
    keys.receive(report("router-b", "SecretNotWatched", 0.0), 0.0)
    reason, message = keys.problem("ns", "databricks", 1.0)
    assert reason == "SecretNotWatched"
    assert message == "router router-a (and 1 other router replica(s)): secret ns/token: not watched"
    keys.receive(report("router-a", None, 5.0), 5.0)  # fixed on router-a; router-b still says so
    assert keys.problem("ns", "databricks", 6.0)[1].startswith("router router-b: ")
    assert keys.problem("ns", "databricks", 31.0) is None  # router-b silent for three periods: gone
    assert keys.problem("ns", "other", 6.0) is None

    provider = {"apiVersion": "kinference.buoyant.io/v1alpha1", "kind": "InferenceProvider",
                "metadata": {"name": "databricks", "namespace": "ns", "generation": 2},
                "spec": {"url": "https://x.invalid", "auth": {"secretRef": {"name": "token", "key": "k"}},
                         "models": [{"name": "m", "upstreamName": "m"}]}}
    cond = provider_status(provider, None, 0.0, ("SecretNotWatched", "router r: why"))["conditions"][0]
    assert (cond["status"], cond["reason"], cond["message"]) == ("False", "SecretNotWatched", "router r: why")
    assert provider_status(provider, None, 0.0)["conditions"][0]["reason"] == "Configured"
    incomplete = {**provider, "spec": {"url": "https://x.invalid"}}
    assert provider_status(incomplete, None, 0.0, ("SecretNotWatched", "w"))["conditions"][0]["reason"] == "Incomplete"
