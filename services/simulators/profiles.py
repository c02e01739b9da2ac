"""GPU speed profiles: how long one engine step takes, and what the GPU looks like.

A step's duration is linear in its work, the usual first-order model of a
transformer forward pass over a mixed (chunked-prefill + decode) batch::

    step = step_overhead + prefill_tokens * prefill_token + decode_seqs * decode_seq
           + decode_context_tokens * context_token

``prefill_tokens`` are the uncached prompt tokens computed in the step (a
prefix-cache hit costs nothing), ``decode_seqs`` the sequences that produce
one token, ``decode_context_tokens`` the KV tokens those decodes attend to.
The numbers are rough orders of magnitude for an 8B model in bf16; "fast" is
for tests. Scheduler defaults follow vLLM's API-server defaults per GPU class.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SpeedProfile:
    name: str
    step_overhead_s: float
    prefill_token_s: float
    decode_seq_s: float
    context_token_s: float
    # scheduler defaults for this GPU class
    max_num_batched_tokens: int
    max_num_seqs: int
    kv_blocks: int
    # what the DCGM simulator reports
    gpu_model: str
    fb_total_mib: int
    power_idle_w: float
    power_max_w: float
    sm_clock_max_mhz: int
    mem_clock_mhz: int

    def step_seconds(
        self, prefill_tokens: int, decode_seqs: int, decode_context_tokens: int = 0
    ) -> float:
        if prefill_tokens == 0 and decode_seqs == 0:
            return 0.0
        return (
            self.step_overhead_s
            + prefill_tokens * self.prefill_token_s
            + decode_seqs * self.decode_seq_s
            + decode_context_tokens * self.context_token_s
        )


PROFILES: dict[str, SpeedProfile] = {
    p.name: p
    for p in (
        SpeedProfile(
            name="h100",
            step_overhead_s=0.006,
            prefill_token_s=0.00006,  # ~16k prefill tokens/s
            decode_seq_s=0.00005,
            context_token_s=2e-8,
            max_num_batched_tokens=8192,
            max_num_seqs=1024,
            kv_blocks=26_000,
            gpu_model="NVIDIA H100 80GB HBM3",
            fb_total_mib=81559,
            power_idle_w=70.0,
            power_max_w=700.0,
            sm_clock_max_mhz=1980,
            mem_clock_mhz=2619,
        ),
        SpeedProfile(
            name="a10g",
            step_overhead_s=0.012,
            prefill_token_s=0.0004,  # ~2.5k prefill tokens/s
            decode_seq_s=0.0003,
            context_token_s=1.5e-7,
            max_num_batched_tokens=2048,
            max_num_seqs=256,
            kv_blocks=2_700,
            gpu_model="NVIDIA A10G",
            fb_total_mib=23028,
            power_idle_w=25.0,
            power_max_w=300.0,
            sm_clock_max_mhz=1710,
            mem_clock_mhz=6251,
        ),
        SpeedProfile(
            name="fast",
            step_overhead_s=0.001,
            prefill_token_s=0.00001,
            decode_seq_s=0.00001,
            context_token_s=0.0,
            max_num_batched_tokens=2048,
            max_num_seqs=64,
            kv_blocks=2048,
            gpu_model="NVIDIA H100 80GB HBM3",
            fb_total_mib=81559,
            power_idle_w=70.0,
            power_max_w=700.0,
            sm_clock_max_mhz=1980,
            mem_clock_mhz=2619,
        ),
    )
}


def get_profile(name: str) -> SpeedProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown speed profile {name!r}; known: {', '.join(PROFILES)}") from None
