"""
disagg_lab 的快速版和 goodput_lab：精简版模拟和原来的模拟逐个请求相等（oracle）、快速的迭代时钟和 iteration_time 逐位相等、
多台 prefill / decode 机的手算小例子、达标率、goodput 的二分（手算的网格）、prefill 的能力上限、分块的拐点（闭式），
以及不合法的输入报 ValueError 而不是卡住。
"""
import math
import os
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "lecture05"))

from hw_specs import H100, IB_NDR, gang  # noqa: E402
from llm_math import LLAMA31_70B, LLAMA31_8B  # noqa: E402
from disagg_lab import fast_colocated, fast_disaggregated, simulate_colocated, simulate_disaggregated  # noqa: E402
from goodput_lab import find_goodput, prefill_capacity, slo_attainment  # noqa: E402
from iteration_lab import iteration_clock, iteration_time, knee_chunk, link_time  # noqa: E402
from workload_lab import poisson_arrivals, uniform_ints  # noqa: E402

M = LLAMA31_8B


def _workload(n, rate, seed=0):
    prompts, outs = uniform_ints(512, 4096, n, seed + 1), uniform_ints(64, 512, n, seed + 2)
    outs[3] = 1                                                     # 一个只生成 1 个 token 的请求
    outs[5] = 2
    return poisson_arrivals(rate, n, seed), prompts, outs


# ---- oracle：精简版 == 原来逐个序列记账的模拟 ----
@pytest.mark.parametrize("rate,chunk", [(3.0, None), (12.0, None), (3.0, 512), (12.0, 300), (20.0, 2048)])
def test_fast_colocated_equals_simulate_colocated_request_by_request(rate, chunk):
    arr, prompts, outs = _workload(80, rate)
    slow = simulate_colocated(M, H100, arr, prompts, outs, chunk=chunk)
    fast = fast_colocated(M, H100, arr, prompts, outs, chunk=chunk)
    for k in slow:
        assert np.array_equal(slow[k], fast[k]), k


@pytest.mark.parametrize("rate", [3.0, 12.0, 40.0])
def test_fast_disaggregated_1_1_equals_simulate_disaggregated(rate):
    arr, prompts, outs = _workload(80, rate, seed=7)
    kv = lambda n: link_time(M.kv_bytes(n), IB_NDR)               # noqa: E731
    slow = simulate_disaggregated(M, H100, arr, prompts, outs, kv)
    fast = fast_disaggregated(M, H100, arr, prompts, outs, kv)
    for k in slow:
        assert np.array_equal(slow[k], fast[k]), k


def test_iteration_clock_is_bit_identical_to_iteration_time():
    for model, chip in ((LLAMA31_8B, H100), (LLAMA31_70B, gang(H100, 4))):
        clock, decode_clock = iteration_clock(model, chip)
        u = np.random.default_rng(3).random((200, 4))
        for n, ctx, c, p in zip((u[:, 0] * 300).astype(int), (u[:, 1] * 900_000).astype(int),
                                (u[:, 2] * 5000).astype(int), (u[:, 3] * 4000).astype(int)):
            n, ctx, c, p = int(n), int(ctx), int(c), int(p)
            if n == 0 and c == 0:
                continue
            assert clock(n, ctx, c, p) == iteration_time(model, chip, n, ctx, prefill_tokens=c, prefill_prefix=p)
        ctxs = np.array([1, 10, 12345, 987_654], dtype=np.int64)
        assert decode_clock(17, ctxs).tolist() == [iteration_time(model, chip, 17, int(x)) for x in ctxs]


# ---- 多台机器：手算的小例子 ----
def test_two_prefill_machines_work_in_parallel_and_one_queues():
    """两个请求同时到达：两台 prefill 机各做一个（TTFT 都是一次 prefill）；一台时第二个要等第一个做完。"""
    arr, prompts, outs = [0.0, 0.0], [1000, 2000], [3, 3]
    t1, t2 = (iteration_time(M, H100, prefill_tokens=n) for n in prompts)
    kv = lambda n: 1e-3                                             # noqa: E731
    two = fast_disaggregated(M, H100, arr, prompts, outs, kv, n_prefill=2, n_decode=2)
    assert two["ttft"].tolist() == [t1, t2]
    one = fast_disaggregated(M, H100, arr, prompts, outs, kv, n_prefill=1, n_decode=2)
    assert one["ttft"].tolist() == [t1, t1 + t2]
    # 两台 decode 机各一个请求：各自单独 decode，两步的时间是上下文 P+1、P+2 的单序列步
    for r, t_first in zip(range(2), two["ttft"]):
        d1 = iteration_time(M, H100, 1, prompts[r] + 1)
        d2 = iteration_time(M, H100, 1, prompts[r] + 2)
        assert two["first_gap"][r] == pytest.approx(1e-3 + d1, rel=1e-12)
        assert two["tpot"][r] == pytest.approx((1e-3 + d1 + d2) / 2, rel=1e-12)
        assert two["finish"][r] == pytest.approx(t_first + 1e-3 + d1 + d2, rel=1e-12)
    # 一台 decode 机：两个请求同时到 decode 机、在同一个批里走一步（TPOT = 搬 KV + 两个序列的一步）
    both = fast_disaggregated(M, H100, [0.0, 0.0], [1000, 1000], [2, 2], kv, n_prefill=2, n_decode=1)
    step = iteration_time(M, H100, 2, 2 * 1001)
    assert both["tpot"] == pytest.approx([1e-3 + step] * 2, rel=1e-12)
    assert both["peak_ctx"] == 2 * 1001


def test_peak_ctx_of_one_request_is_prompt_plus_one():
    res = fast_colocated(M, H100, [0.0], [1234], [5])
    assert res["peak_ctx"] == 1235


# ---- 达标率与 goodput ----
def test_slo_attainment_needs_both_targets():
    res = {"ttft": np.array([0.1, 0.3, 0.1, 0.05]), "tpot": np.array([0.01, 0.01, 0.03, 0.0])}
    assert slo_attainment(res, 0.2, 0.02) == 0.5                   # 第 1、4 个两项都达标
    assert slo_attainment(res, 0.3, 0.03) == 1.0                   # 等于目标也算达标
    with pytest.raises(ValueError, match="为正"):
        slo_attainment(res, 0.0, 0.02)


def test_find_goodput_bisects_the_grid_then_refines_once():
    """手算：真值 7.3。粗网格 2..10：二分到 6 达标、8 不达标；这一格插 4 个点（步长 0.4）：7.2 达标、7.6 不达标。"""
    calls = []

    def att(r):
        calls.append(r)
        return 1.0 if r <= 7.3 else 0.5
    gp = find_goodput(att, [2, 4, 6, 8, 10], n_refine=4)
    assert gp["goodput"] == pytest.approx(7.2) and gp["upper"] == pytest.approx(7.6)
    assert len(calls) == len(set(calls)) < 5 + 4                   # 二分：每个点最多算一次，少于挨个试
    assert all(v == att(r) for r, v in gp["tested"].items())
    # 边界：全都达标 -> 上界 inf；最低的也不达标 -> 0
    assert find_goodput(lambda r: 1.0, [1, 2, 3]) == {"goodput": 3.0, "upper": math.inf,
                                                       "tested": {2.0: 1.0, 3.0: 1.0}}
    assert find_goodput(lambda r: 0.0, [1, 2, 3])["goodput"] == 0.0
    assert find_goodput(lambda r: 0.0, [1, 2, 3])["upper"] == 1.0
    # n_refine = 0：只用粗网格
    gp0 = find_goodput(att, [2, 4, 6, 8, 10], n_refine=0)
    assert (gp0["goodput"], gp0["upper"]) == (6.0, 8.0)


def test_find_goodput_treats_rates_above_the_capacity_as_failing():
    """max_rate 以上不模拟、直接算不达标：真值 7.3 但上限 6.5 -> 细找停在 6.4（步长 0.4：6.4 < 6.5 ≤ 6.8）。"""
    seen = []
    gp = find_goodput(lambda r: seen.append(r) or 1.0, [2, 4, 6, 8, 10], n_refine=4, max_rate=6.5)
    assert gp["goodput"] == pytest.approx(6.4) and gp["upper"] == pytest.approx(6.8)
    assert max(seen) < 6.5


def test_prefill_capacity_is_one_over_the_mean_prefill_time():
    prompts = [512, 1024, 4095]
    mean = sum(iteration_time(M, H100, prefill_tokens=n) for n in prompts) / 3
    assert prefill_capacity(M, H100, prompts) == pytest.approx(1 / mean, rel=1e-12)
    # 一个 4096 的提示在 H100 上是 compute-bound：闭式 FLOPs / 峰值（lm_head 只算最后一个位置）
    head, n = 128256 * 4096, 4096
    flops = 2 * (7_504_658_432 - head) * n + 2 * head + 4 * 32 * 128 * 32 * n * (n + 1) // 2
    assert prefill_capacity(M, H100, [n]) == pytest.approx(989.4e12 / flops, rel=1e-12)


def test_knee_chunk_matches_the_closed_form():
    """
    独立的闭式：顺带 c 个（从头算的）提示 token 后 FLOPs 仍 ≤ 峰值 × 读的时间。逐个 c 找最大的那个。
    """
    P, BW = 989.4e12, 3.35e12
    mm, head, attn, kv = 7_504_658_432, 128256 * 4096, 4 * 32 * 128 * 32, 2 * 32 * 8 * 128 * 2
    w = 2 * (8_030_261_248 - head)
    for B, L in ((8, 2000), (32, 2500), (64, 3000)):
        ctx = B * L
        t_mem = (w + kv * ctx) / BW
        assert (2 * mm * B + attn * ctx) / P < t_mem                  # 这一步本来受带宽限制

        def fits(c):
            return 2 * mm * B + attn * ctx + 2 * (mm - head) * c + 2 * head + attn * c * (c + 1) // 2 <= P * t_mem
        c = 1
        while fits(c):
            c += 1
        assert knee_chunk(M, H100, B, ctx) == c - 1
    assert knee_chunk(M, H100, 600, 600 * 100) == 0                  # 批大、上下文短：本来就 compute-bound


# ---- 不合法的输入：报错，不卡住 ----
def test_goodput_functions_reject_bad_inputs_instead_of_hanging():
    with pytest.raises(ValueError, match="至少生成 1 个"):
        fast_colocated(M, H100, [0.0, 1.0], [10, 10], [3, 0])
    with pytest.raises(ValueError, match="提示至少 1 个"):
        fast_disaggregated(M, H100, [0.0], [0], [3], lambda n: 0.0)
    with pytest.raises(ValueError, match="分块"):
        fast_colocated(M, H100, [0.0], [10], [3], chunk=0)
    with pytest.raises(ValueError, match="至少 1 台"):
        fast_disaggregated(M, H100, [0.0], [10], [3], lambda n: 0.0, n_prefill=0)
    with pytest.raises(ValueError, match="至少 1 台"):
        fast_disaggregated(M, H100, [0.0], [10], [3], lambda n: 0.0, n_decode=0)
    with pytest.raises(ValueError, match="一样长"):
        fast_colocated(M, H100, [0.0], [10, 10], [3, 3])
    # 回归：到达时刻是 NaN 时两个模拟都一直等下去（t 变成 NaN，"到达 ≤ t" 永远不成立）；乱序的到达会被按编号排队
    for arr in ([0.0, float("nan")], [1.0, 0.0], [-1.0, 0.0], [0.0, float("inf")]):
        with pytest.raises(ValueError, match="到达时刻"):
            fast_colocated(M, H100, arr, [10, 10], [3, 3])
        with pytest.raises(ValueError, match="到达时刻"):
            fast_disaggregated(M, H100, arr, [10, 10], [3, 3], lambda n: 0.0)
        with pytest.raises(ValueError, match="到达时刻"):
            simulate_colocated(M, H100, arr, [10, 10], [3, 3])
    for bad in ([], [2, 1], [0, 1], [-1, 2]):
        with pytest.raises(ValueError, match="递增的正数"):
            find_goodput(lambda r: 1.0, bad)
    with pytest.raises(ValueError, match="goal"):
        find_goodput(lambda r: 1.0, [1, 2], goal=0)
    with pytest.raises(ValueError, match="n_refine"):
        find_goodput(lambda r: 1.0, [1, 2], n_refine=-1)
    for rate in (0.0, -3.0, float("nan")):
        with pytest.raises(ValueError, match="到达率"):
            poisson_arrivals(rate, 5, 0)
    with pytest.raises(ValueError, match="提示"):
        prefill_capacity(M, H100, [100, 0])
    with pytest.raises(ValueError, match="至少 1 个序列"):
        knee_chunk(M, H100, 0, 0)
