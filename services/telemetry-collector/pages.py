"""Exposition pages in vLLM's and DCGM exporter's formats, rendered from numbers.

Used by the collector's tests and benchmark (and handy to eyeball what the
parser reads). The vLLM page carries what a real V1-engine ``/metrics`` page
carries besides the families the collector reads: ``# HELP``/``# TYPE``
lines, ``_created`` series, full histogram bucket sets, Python process and
HTTP-server metrics, so parsing cost is measured on realistic input.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)
TOKEN_BUCKETS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0, 5000.0, 10000.0)
CREATED = 1.7e9


@dataclass
class VllmPage:
    """The numbers behind one engine's page (per ``engine`` label value)."""

    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    engines: int = 1
    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    block_size: int = 16
    num_gpu_blocks: int = 8192
    prefix_queries: float = 0.0
    prefix_hits: float = 0.0
    preemptions: float = 0.0
    prompt_tokens: float = 0.0
    generation_tokens: float = 0.0
    requests: float = 0.0
    ttft_sum: float = 0.0
    queue_sum: float = 0.0
    prefill_sum: float = 0.0
    kv_computed_sum: float = 0.0
    #: render the pre-0.12 names (gpu_cache_usage_perc, gpu_prefix_cache_*,
    #: time_per_output_token_seconds) instead of the new ones
    old_names: bool = False
    extra_lines: list[str] = field(default_factory=list)

    def advance(self, requests: int, prompt: int = 1000, hit: float = 0.5, ttft: float = 0.2,
                queue: float = 0.05, prefill: float = 0.1) -> None:
        """Account ``requests`` finished requests of ``prompt`` tokens each."""
        self.requests += requests
        self.prompt_tokens += requests * prompt
        self.prefix_queries += requests * prompt
        self.prefix_hits += requests * prompt * hit
        self.kv_computed_sum += requests * prompt * (1 - hit)
        self.ttft_sum += requests * ttft
        self.queue_sum += requests * queue
        self.prefill_sum += requests * prefill
        self.generation_tokens += requests * 200


def _hist(out: list[str], name: str, help_: str, labels: str, buckets: tuple[float, ...],
          count: float, total: float) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} histogram")
    for le in buckets:
        # a plausible cumulative shape: half the mass below the mean's bucket
        mean = total / count if count else 0.0
        c = count if le >= mean * 2 else (count * 0.5 if le >= mean else count * 0.1)
        out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(round(c))}')
    out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(count)}')
    out.append(f"{name}_count{{{labels}}} {float(count)}")
    out.append(f"{name}_sum{{{labels}}} {float(total)}")
    out.append(f"# HELP {name}_created {help_}")
    out.append(f"# TYPE {name}_created gauge")
    out.append(f"{name}_created{{{labels}}} {CREATED}")


def _counter(out: list[str], name: str, help_: str, series: list[tuple[str, float]]) -> None:
    out.append(f"# HELP {name}_total {help_}")
    out.append(f"# TYPE {name}_total counter")
    for labels, v in series:
        out.append(f"{name}_total{{{labels}}} {float(v)}")
    out.append(f"# HELP {name}_created {help_}")
    out.append(f"# TYPE {name}_created gauge")
    for labels, _ in series:
        out.append(f"{name}_created{{{labels}}} {CREATED}")


def _gauge(out: list[str], name: str, help_: str, series: list[tuple[str, float]]) -> None:
    out.append(f"# HELP {name} {help_}")
    out.append(f"# TYPE {name} gauge")
    for labels, v in series:
        out.append(f"{name}{{{labels}}} {v!r}" if isinstance(v, float) else f"{name}{{{labels}}} {v}")


def _process_metrics(out: list[str]) -> None:
    for gen in range(3):
        out.append(f'python_gc_objects_collected_total{{generation="{gen}"}} {1234.0 * (gen + 1)}')
        out.append(f'python_gc_objects_uncollectable_total{{generation="{gen}"}} 0.0')
        out.append(f'python_gc_collections_total{{generation="{gen}"}} {321.0 + gen}')
    out.append('python_info{implementation="CPython",major="3",minor="12",patchlevel="9",version="3.12.9"} 1.0')
    for name, v in (("process_virtual_memory_bytes", 6.9e10), ("process_resident_memory_bytes", 3.2e9),
                    ("process_start_time_seconds", 1.7e9), ("process_cpu_seconds_total", 5321.5),
                    ("process_open_fds", 129.0), ("process_max_fds", 1048576.0)):
        out.append(f"# HELP {name} {name}")
        out.append(f"# TYPE {name} gauge")
        out.append(f"{name} {v}")
    handlers = ("/v1/chat/completions", "/v1/completions", "/metrics", "/health", "/v1/models")
    out.append("# HELP http_requests_total Total number of requests by method, status and handler.")
    out.append("# TYPE http_requests_total counter")
    for h in handlers:
        out.append(f'http_requests_total{{handler="{h}",method="GET",status="2xx"}} 1234.0')
    out.append("# HELP http_request_duration_seconds Latency with only few buckets by handler.")
    out.append("# TYPE http_request_duration_seconds histogram")
    for h in handlers:
        for le in (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0):
            out.append(f'http_request_duration_seconds_bucket{{handler="{h}",le="{le}",method="GET"}} 1200.0')
        out.append(f'http_request_duration_seconds_bucket{{handler="{h}",le="+Inf",method="GET"}} 1234.0')
        out.append(f'http_request_duration_seconds_count{{handler="{h}",method="GET"}} 1234.0')
        out.append(f'http_request_duration_seconds_sum{{handler="{h}",method="GET"}} 98.7')


def render_vllm(p: VllmPage) -> str:
    """The page as vLLM's ``/metrics`` would serve it (values split evenly over engines)."""
    out: list[str] = []
    _process_metrics(out)
    n = max(1, p.engines)
    engines = [f'engine="{e}",model_name="{p.model}"' for e in range(n)]

    def each(v: float) -> list[tuple[str, float]]:
        return [(lab, v / n) for lab in engines]

    def each_int(v: int) -> list[tuple[str, float]]:
        # integers split so the sum is exact
        return [(lab, float(v // n + (1 if e < v % n else 0))) for e, lab in enumerate(engines)]

    _gauge(out, "vllm:num_requests_running", "Number of requests in model execution batches.",
           each_int(p.running))
    _gauge(out, "vllm:num_requests_waiting", "Number of requests waiting to be processed.",
           each_int(p.waiting))
    _gauge(out, "vllm:num_requests_waiting_by_reason", "Waiting requests by reason.",
           [(f'{lab},reason="capacity"', 0.0) for lab in engines])
    _gauge(out, "vllm:engine_sleep_state", "Engine sleep state",
           [(f'{lab},sleep_state="awake"', 1.0) for lab in engines])
    kv_name = "vllm:gpu_cache_usage_perc" if p.old_names else "vllm:kv_cache_usage_perc"
    _gauge(out, kv_name, "KV-cache usage. 1 means 100 percent usage.",
           [(lab, float(p.kv_usage)) for lab in engines])
    _gauge(out, "vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
           [(f'block_size="{p.block_size}",cache_dtype="auto",calculate_kv_scales="False",{lab},'
             f'enable_prefix_caching="True",gpu_memory_utilization="0.9",'
             f'num_gpu_blocks="{p.num_gpu_blocks}",num_gpu_blocks_override="None",'
             f'prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4"', 1.0)
            for lab in engines])
    _gauge(out, "vllm:lora_requests_info", "Running stats on lora requests.",
           [('max_lora="0",running_lora_adapters="",waiting_lora_adapters=""', 1.7e9)])
    pc = "vllm:gpu_prefix_cache" if p.old_names else "vllm:prefix_cache"
    _counter(out, f"{pc}_queries", "Prefix cache queries, in terms of number of queried tokens.",
             each(p.prefix_queries))
    _counter(out, f"{pc}_hits", "Prefix cache hits, in terms of number of cached tokens.",
             each(p.prefix_hits))
    _counter(out, "vllm:num_preemptions", "Cumulative number of preemption from the engine.",
             each(p.preemptions))
    _counter(out, "vllm:prompt_tokens", "Number of prefill tokens processed.", each(p.prompt_tokens))
    _counter(out, "vllm:prompt_tokens_by_source", "Number of prompt tokens by source.",
             [(f'{lab},source="local_compute"', p.kv_computed_sum / n) for lab in engines]
             + [(f'{lab},source="local_cache_hit"', (p.prompt_tokens - p.kv_computed_sum) / n)
                for lab in engines])
    _counter(out, "vllm:generation_tokens", "Number of generation tokens processed.",
             each(p.generation_tokens))
    _counter(out, "vllm:request_success", "Count of successfully processed requests.",
             [(f'{lab},finished_reason="{r}"', p.requests / n / 3) for lab in engines
              for r in ("stop", "length", "abort")])
    for lab in engines:
        c = p.requests / n
        _hist(out, "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
              lab, TTFT_BUCKETS, c, p.ttft_sum / n)
        itl = "vllm:time_per_output_token_seconds" if p.old_names else "vllm:inter_token_latency_seconds"
        _hist(out, itl, "Histogram of inter-token latency in seconds.", lab, ITL_BUCKETS,
              p.generation_tokens / n, p.generation_tokens / n * 0.02)
        _hist(out, "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.",
              lab, LATENCY_BUCKETS, c, c * 4.0)
        _hist(out, "vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase.",
              lab, LATENCY_BUCKETS, c, p.queue_sum / n)
        _hist(out, "vllm:request_inference_time_seconds", "Histogram of time spent in RUNNING phase.",
              lab, LATENCY_BUCKETS, c, c * 3.9)
        _hist(out, "vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase.",
              lab, LATENCY_BUCKETS, c, p.prefill_sum / n)
        _hist(out, "vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase.",
              lab, LATENCY_BUCKETS, c, c * 3.8)
        _hist(out, "vllm:request_prompt_tokens", "Number of prefill tokens processed.", lab,
              TOKEN_BUCKETS, c, p.prompt_tokens / n)
        _hist(out, "vllm:request_generation_tokens", "Number of generation tokens processed.", lab,
              TOKEN_BUCKETS, c, p.generation_tokens / n)
        _hist(out, "vllm:request_prefill_kv_computed_tokens", "KV tokens computed during prefill.",
              lab, TOKEN_BUCKETS, c, p.kv_computed_sum / n)
        _hist(out, "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
              lab, TOKEN_BUCKETS, c * 50, p.prompt_tokens / n + p.generation_tokens / n)
        _hist(out, "vllm:request_max_num_generation_tokens", "Max generation tokens.", lab,
              TOKEN_BUCKETS, c, c * 1024)
    out.extend(p.extra_lines)
    return "\n".join(out) + "\n"


@dataclass
class Gpu:
    """One GPU as DCGM exporter reports it."""

    gpu: int
    uuid: str
    namespace: str = ""
    pod: str = ""
    util_percent: float = 0.0
    fb_used: float = 0.0
    fb_free: float = 81559.0
    fb_reserved: float = 0.0
    xid: float = 0.0
    hostname: str = "node-a"


def render_dcgm(gpus: list[Gpu], hostname_label: str = "Hostname", pod_label: str = "pod",
                namespace_label: str = "namespace") -> str:
    """A DCGM exporter page; the label spellings are those of the release chosen."""
    out: list[str] = []
    fields = (
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", lambda g: 1980.0),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", lambda g: 2619.0),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", lambda g: 41.0),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", lambda g: 312.5),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", lambda g: g.util_percent),
        ("DCGM_FI_DEV_FB_FREE", "gauge", lambda g: g.fb_free),
        ("DCGM_FI_DEV_FB_USED", "gauge", lambda g: g.fb_used),
        ("DCGM_FI_DEV_FB_RESERVED", "gauge", lambda g: g.fb_reserved),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", lambda g: g.xid),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", lambda g: g.util_percent / 100),
    )
    for name, kind, value in fields:
        out.append(f"# HELP {name} {name}.")
        out.append(f"# TYPE {name} {kind}")
        for g in gpus:
            labels = (
                f'gpu="{g.gpu}",UUID="{g.uuid}",pci_bus_id="00000000:{g.gpu + 16:02X}:00.0",'
                f'device="nvidia{g.gpu}",modelName="NVIDIA H100 80GB HBM3",'
                f'{hostname_label}="{g.hostname}",DCGM_FI_DRIVER_VERSION="550.54.15",'
                f'container="vllm",{namespace_label}="{g.namespace}",{pod_label}="{g.pod}"'
            )
            if name == "DCGM_FI_DEV_XID_ERRORS":
                labels += ',err_code="0",err_msg="No Error"' if not g.xid else f',err_code="{int(g.xid)}"'
            v = value(g)
            text = str(int(v)) if float(v).is_integer() and abs(v) < 1e15 else repr(float(v))
            out.append(f"{name}{{{labels}}} {text}")
    return "\n".join(out) + "\n"
