"""serving_lab：多卡合成、权重字节、显存装得下的批、B*、一次迭代的时间（和 llm_math 逐个对上）、链路时间、模拟的守恒与边界。"""
import math
import os
import sys
from dataclasses import replace

import numpy as np
import pytest

from conftest import ROOT, load_script

sys.path.insert(0, os.path.join(ROOT, "lecture05"))

from hw_specs import ALL_LINKS, ETH_100G, ETH_400G, H100, IB_NDR, NVLINK4, PCIE5_X16  # noqa: E402
from llm_math import GPT_OSS_120B, LLAMA31_405B, LLAMA31_70B, LLAMA31_8B, decode_step, prefill_time  # noqa: E402
from hw_specs import gang  # noqa: E402
from llm_math import active_weight_bytes, compute_bound_batch, max_batch, weight_bytes  # noqa: E402
from serving_lab import (iteration_time, link_time, poisson_arrivals, simulate_batching,  # noqa: E402
                         simulate_colocated, simulate_disaggregated, step_time, uniform_ints)


# ---- 互联表（hw_specs 末尾）----
def test_link_table_is_per_direction_and_matches_the_published_numbers():
    assert NVLINK4.bidir_bw == 900e9 == H100.link_bw and NVLINK4.bw == 450e9
    assert IB_NDR.bw == 50e9 and ETH_400G.bw == 50e9 and ETH_100G.bw == 12.5e9
    assert PCIE5_X16.bw == 64e9 and PCIE5_X16.bidir_bw == 128e9
    for lk in ALL_LINKS:
        assert lk.bidir_bw == 2 * lk.bw and lk.source


def test_link_time_divides_by_links_and_rejects_nonsense():
    assert link_time(671e6, IB_NDR) == pytest.approx(13.42e-3)
    assert link_time(671e6, IB_NDR, 8) == pytest.approx(13.42e-3 / 8)
    with pytest.raises(ValueError):
        link_time(-1, IB_NDR)
    with pytest.raises(ValueError):
        link_time(1, IB_NDR, 0)


# ---- 账 ----
def test_gang_multiplies_bandwidth_capacity_and_flops():
    g = gang(H100, 8)
    assert g.mem_bw == 8 * H100.mem_bw and g.mem_bytes == 640e9
    assert g.peak_flops("bf16") == 8 * H100.peak_flops("bf16")
    assert g.ridge_point("bf16") == pytest.approx(H100.ridge_point("bf16"))
    assert gang(H100, 1).mem_bw == H100.mem_bw
    with pytest.raises(ValueError):
        gang(H100, 0)


def test_weight_bytes_dense_and_gpt_oss_checkpoint():
    assert weight_bytes(LLAMA31_8B) == 2 * 8_030_261_248
    assert weight_bytes(LLAMA31_70B, 8) == 70_553_706_496
    # 发布格式：专家 MXFP4（4.25 位）、其余 BF16 → checkpoint 60.8 GiB（模型卡）
    assert weight_bytes(GPT_OSS_120B, 16, 4.25) / 2 ** 30 == pytest.approx(60.8, rel=0.005)


def test_active_weight_bytes_agree_with_decode_step_at_batch_1():
    for m, bits in ((LLAMA31_8B, 16), (LLAMA31_70B, 8), (GPT_OSS_120B, 4.25)):
        assert active_weight_bytes(m, bits) == pytest.approx(decode_step(m, H100, 1, 0, w_bits=bits)["w_bytes"], rel=1e-12)
    assert active_weight_bytes(GPT_OSS_120B, 16, 4.25) > active_weight_bytes(GPT_OSS_120B, 4.25)


def test_max_batch_closed_form_and_edges():
    assert max_batch(LLAMA31_8B, H100, 2048) == int((80e9 - 2 * 8_030_261_248) // (131072 * 2048)) == 238
    assert max_batch(LLAMA31_70B, gang(H100, 8), 2048) == int((640e9 - 2 * 70_553_706_496) // (327680 * 2048))
    assert max_batch(LLAMA31_405B, H100, 2048) == 0
    with pytest.raises(ValueError):
        max_batch(LLAMA31_8B, H100, 0)


@pytest.mark.parametrize("model,chip,ctx", [(LLAMA31_8B, H100, 128), (LLAMA31_8B, H100, 256),
                                            (LLAMA31_70B, gang(H100, 8), 1024), (LLAMA31_70B, H100, 0)])
def test_compute_bound_batch_is_where_decode_step_flips(model, chip, ctx):
    b = compute_bound_batch(model, chip, ctx)
    assert decode_step(model, chip, math.ceil(b), ctx)["bound"] == "compute"
    assert decode_step(model, chip, math.floor(b), ctx)["bound"] == "memory"


def test_compute_bound_batch_edges():
    assert compute_bound_batch(LLAMA31_8B, H100, 0) == pytest.approx(H100.ridge_point("bf16"), rel=1e-3)
    assert compute_bound_batch(LLAMA31_8B, H100, 512) == math.inf
    assert decode_step(LLAMA31_8B, H100, 100000, 512)["bound"] == "memory"
    with pytest.raises(ValueError, match="MoE"):
        compute_bound_batch(GPT_OSS_120B, H100, 128)


@pytest.mark.parametrize("n", [1, 100, 512, 4096, 20000])
def test_iteration_time_pure_prefill_is_prefill_time(n):
    assert iteration_time(LLAMA31_8B, H100, prefill_tokens=n) == pytest.approx(prefill_time(LLAMA31_8B, H100, n), rel=1e-12)


@pytest.mark.parametrize("B,L", [(1, 1), (32, 2048), (300, 10)])
def test_iteration_time_pure_decode_is_decode_step(B, L):
    assert iteration_time(LLAMA31_70B, H100, B, B * L) == pytest.approx(decode_step(LLAMA31_70B, H100, B, L)["time"], rel=1e-12)


def test_chunked_prefill_flops_add_up_to_the_whole_prefill():
    """无限带宽时时间 = FLOPs / 峰值：分块算的 FLOPs 之和必须等于整段 prefill（因果注意力的对数不能丢、不能重）。"""
    fast = replace(H100, mem_bw=1e30)
    n, c = 3000, 512
    parts = sum(iteration_time(LLAMA31_8B, fast, prefill_tokens=min(c, n - i), prefill_prefix=i) for i in range(0, n, c))
    assert parts == pytest.approx(iteration_time(LLAMA31_8B, fast, prefill_tokens=n), rel=1e-12)


def test_iteration_time_rejects_moe_sliding_and_empty():
    with pytest.raises(ValueError):
        iteration_time(GPT_OSS_120B, H100, 1, 10)
    with pytest.raises(ValueError):
        iteration_time(LLAMA31_8B, H100)


def test_step_time_reproduces_seed05_draft_times():
    seed = load_script("lecture05/05_heterogeneous_spec_decode.py")
    assert step_time(1.6e9, H100.mem_bw, 0.3e-3) == pytest.approx(seed.t_draft("gpu"), rel=1e-12)
    assert step_time(1.6e9, 2 * 150e12, 0.05e-3) == pytest.approx(seed.t_draft("sram"), rel=1e-12)


# ---- 随机数 ----
def test_arrivals_and_uniform_ints_are_deterministic_and_have_the_right_law():
    a = poisson_arrivals(10.0, 4000, 0)
    assert np.array_equal(a, poisson_arrivals(10.0, 4000, 0))
    assert np.all(np.diff(a) > 0) and a[0] > 0
    assert np.mean(np.diff(a)) == pytest.approx(0.1, rel=0.06)
    u = uniform_ints(5, 9, 4000, 3)
    assert u.min() == 5 and u.max() == 8 and np.array_equal(u, uniform_ints(5, 9, 4000, 3))
    assert np.bincount(u - 5).min() > 900


# ---- 模拟 ----
def test_batching_simulation_conserves_tokens_and_continuous_wins():
    outs = uniform_ints(1, 200, 100, 0)
    st = simulate_batching(LLAMA31_8B, H100, 256, outs, 16, False)
    co = simulate_batching(LLAMA31_8B, H100, 256, outs, 16, True)
    assert st["tokens"] == co["tokens"] == int(outs.sum())
    assert co["throughput"] > st["throughput"] and co["mean_active"] > st["mean_active"]
    assert st["steps"] == sum(max(outs[i:i + 16]) for i in range(0, 100, 16))


def test_batching_simulation_equal_lengths_static_equals_continuous():
    outs = [50] * 32
    st = simulate_batching(LLAMA31_8B, H100, 100, outs, 8, False)
    co = simulate_batching(LLAMA31_8B, H100, 100, outs, 8, True)
    assert st == co and st["steps"] == 200


def test_single_request_colocated_and_disaggregated_times_are_exact():
    m, P = LLAMA31_8B, 1000
    arr, prompts, outs = np.array([0.5]), np.array([P]), np.array([3])
    t_pre = iteration_time(m, H100, prefill_tokens=P)
    d1, d2 = iteration_time(m, H100, 1, P + 1), iteration_time(m, H100, 1, P + 2)
    c = simulate_colocated(m, H100, arr, prompts, outs)
    assert c["ttft"][0] == pytest.approx(t_pre) and c["tpot"][0] == pytest.approx((d1 + d2) / 2)
    assert c["first_gap"][0] == pytest.approx(d1) and c["max_gap"][0] == pytest.approx(max(d1, d2))
    kv = 7e-3
    d = simulate_disaggregated(m, H100, arr, prompts, outs, lambda n: kv)
    assert d["ttft"][0] == pytest.approx(t_pre)
    assert d["first_gap"][0] == pytest.approx(kv + d1)
    assert d["finish"][0] == pytest.approx(0.5 + t_pre + kv + d1 + d2)
    k = simulate_colocated(m, H100, arr, prompts, outs, chunk=300)
    chunks = sum(iteration_time(m, H100, prefill_tokens=min(300, P - i), prefill_prefix=i) for i in range(0, P, 300))
    assert k["ttft"][0] == pytest.approx(chunks)


def test_colocated_prefill_stalls_decodes_and_disaggregation_does_not():
    m = LLAMA31_8B
    arr = poisson_arrivals(8.0, 120, 0)
    prompts, outs = uniform_ints(512, 4096, 120, 1), uniform_ints(64, 512, 120, 2)
    c = simulate_colocated(m, H100, arr, prompts, outs, n_gpus=2)
    d = simulate_disaggregated(m, H100, arr, prompts, outs, lambda n: link_time(m.kv_bytes(n), IB_NDR))
    assert np.all(c["ttft"] > 0) and np.all(d["ttft"] > 0)
    assert np.percentile(c["max_gap"], 99) > 2 * np.percentile(d["max_gap"], 99)
    # 解耦：最长的等待几乎总是第 1→2 个 token（搬 KV + 等下一步），之后只有纯 decode 步
    assert np.mean(d["first_gap"] >= d["max_gap"]) > 0.9
    c2 = simulate_colocated(m, H100, arr, prompts, outs, n_gpus=2)
    assert all(np.array_equal(c[k], c2[k]) for k in c)
