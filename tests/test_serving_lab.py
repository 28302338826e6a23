"""
第 5 讲的 iteration_lab（一次迭代的时间，和 llm_math 逐个对上；链路时间；种子 05 的 step_time）、workload_lab（确定的
随机数）、batching_lab 和 disagg_lab（模拟的守恒与边界、卡住时报错）。
权重字节、max_batch、compute_bound_batch、critical_context 搬到了 llm_math，测试在 tests/test_llm_math.py。
"""
import inspect
import math
import os
import sys
import types
from dataclasses import replace

import numpy as np
import pytest

from conftest import ROOT, load_script

sys.path.insert(0, os.path.join(ROOT, "lecture05"))

from hw_specs import ALL_LINKS, ETH_100G, ETH_400G, H100, IB_NDR, NVLINK4, PCIE5_X16  # noqa: E402
from llm_math import GPT_OSS_120B, LLAMA31_70B, LLAMA31_8B, decode_step, prefill_time  # noqa: E402
from hw_specs import gang  # noqa: E402
import batching_lab  # noqa: E402
import disagg_lab  # noqa: E402
import iteration_lab  # noqa: E402
import paging_lab  # noqa: E402
from batching_lab import simulate_batching  # noqa: E402
from disagg_lab import fast_colocated, fast_disaggregated, simulate_colocated, simulate_disaggregated  # noqa: E402
from iteration_lab import iteration_time, knee_chunk, link_time, step_time  # noqa: E402
from workload_lab import poisson_arrivals, uniform_ints  # noqa: E402


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
    """gang 搬到了 hw_specs（tests/test_hw_specs.py 还没有它的测试，先留在这里）；第 5 讲 01、03 和第 6 讲 05 都靠它。"""
    g = gang(H100, 8)
    assert g.mem_bw == 8 * H100.mem_bw and g.mem_bytes == 640e9
    assert g.peak_flops("bf16") == 8 * H100.peak_flops("bf16")
    assert g.ridge_point("bf16") == pytest.approx(H100.ridge_point("bf16"))
    assert gang(H100, 1).mem_bw == H100.mem_bw
    with pytest.raises(ValueError):
        gang(H100, 0)


@pytest.mark.parametrize("n", [1, 100, 512, 4096, 20000])
def test_iteration_time_pure_prefill_is_prefill_time(n):
    assert iteration_time(LLAMA31_8B, H100, prefill_tokens=n) == pytest.approx(prefill_time(LLAMA31_8B, H100, n), rel=1e-12)


@pytest.mark.parametrize("B,L", [(1, 1), (32, 2048), (300, 10)])
def test_iteration_time_pure_decode_is_decode_step(B, L):
    assert iteration_time(LLAMA31_70B, H100, B, B * L) == pytest.approx(decode_step(LLAMA31_70B, H100, B, L)["time"], rel=1e-12)


@pytest.mark.parametrize("n,c", [(3000, 512), (1024, 1024), (1000, 1), (4097, 2048)])
def test_chunked_prefill_flops_add_up_to_the_whole_prefill(n, c):
    """
    无限带宽时时间 = FLOPs / 峰值。分块 prefill 的每一块都在自己的最后一个位置算一次 lm_head（iteration_time 的约定，
    同 llm_math.prefill_step），整段只算一次，所以 k 块之和 = 整段 + (k − 1) × 2·vocab·d_model / 峰值；
    其余（块里的矩阵乘、因果注意力的 (query, 位置) 对）不能丢、不能重。
    回归：lm_head 改成只算最后一个位置以后，旧的"之和 = 整段"不再成立（差 5 次 lm_head）。
    """
    m = LLAMA31_8B
    fast = replace(H100, mem_bw=1e30)
    P = H100.peak_flops("bf16")
    k = math.ceil(n / c)
    parts = sum(iteration_time(m, fast, prefill_tokens=min(c, n - i), prefill_prefix=i) for i in range(0, n, c))
    whole = iteration_time(m, fast, prefill_tokens=n)
    head = 128256 * 4096                                            # Llama-3.1-8B 的 lm_head
    assert parts == pytest.approx(whole + (k - 1) * 2 * head / P, rel=1e-12)
    # 整段的闭式（独立写）：块里的矩阵乘每个位置一次、lm_head 一次、因果注意力 Σ_{i=1..n} i 对
    flops = 2 * (7_504_658_432 - head) * n + 2 * head + 4 * 32 * 128 * 32 * n * (n + 1) // 2
    assert whole == pytest.approx(flops / P, rel=1e-12)


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


def test_simulations_reject_bad_requests_instead_of_hanging():
    from llm_math import LLAMA31_8B as M
    from hw_specs import H100 as C
    with pytest.raises(ValueError, match="至少生成 1 个"):
        simulate_colocated(M, C, [0.0, 1.0], [10, 10], [3, 0])
    with pytest.raises(ValueError, match="一样长"):
        simulate_disaggregated(M, C, [0.0], [10, 10], [3, 3], lambda n: 0.0)
    with pytest.raises(ValueError, match="分块"):
        simulate_colocated(M, C, [0.0], [10], [3], chunk=0)
    with pytest.raises(ValueError, match="至少要有一个请求"):
        simulate_batching(M, C, 10, [], 4, True)
    with pytest.raises(ValueError, match="到达率"):
        poisson_arrivals(0.0, 5, 0)



# ---- 模拟卡住时报错，而不是一直转下去 ----
def _mutant(module, old, new, *more):
    """
    把模块源码里的 old（必须正好出现一次）换成 new（more：再几对 old, new），另外加载成一个新模块：
    种下一个 bug，原来的模块不受影响。
    """
    src = inspect.getsource(module)
    for old, new in [(old, new)] + list(zip(more[::2], more[1::2])):
        assert src.count(old) == 1, f"{module.__name__} 里找不到（或不止一处）要改的那一行：{old!r}"
        src = src.replace(old, new)
    mod = types.ModuleType(module.__name__ + "_mutant")
    mod.__file__ = module.__file__
    exec(compile(src, module.__file__, "exec"), mod.__dict__)
    return mod


def test_batching_simulation_that_never_finishes_a_request_raises():
    """种下的 bug：序列的 token 数不再增加（没有请求会完成）。迭代次数超过 Σ 生成数 就报错。"""
    bad = _mutant(batching_lab, "            active[r] += 1\n", "            active[r] += 0\n")
    for continuous in (True, False):
        with pytest.raises(RuntimeError, match="卡住"):
            bad.simulate_batching(LLAMA31_8B, H100, 100, [3, 5, 2], 2, continuous)


@pytest.mark.parametrize("policy", ["paged", "reserve"])
def test_kv_allocation_that_never_frees_blocks_raises(policy):
    """
    种下的 bug：完成的请求不放回它的块（或预留）。内存漏光以后批空着、队首放不进来：报错，而不是一直等。
    分页时"不放回"是两处都不做：自己的计数不加回来，块也不还给共用的块池（BlockPool，和引擎同一个）。
    """
    bad = _mutant(paging_lab, "free += int(run_h[done].sum())", "free += 0",
                  "            pool.decref_many(np.concatenate(mine))\n", "            pass\n")
    P, O = [10] * 12, [2, 3] * 6
    with pytest.raises(RuntimeError, match="放不进来"):
        bad.simulate_kv_allocation(P, O, 64, policy, reserve=20, block=4, shared_prefix=4 if policy == "paged" else 0,
                                   watermark=0.0)


@pytest.mark.parametrize("policy", ["paged", "reserve"])
def test_kv_allocation_whose_requests_never_finish_raises(policy):
    """
    种下的 bug：没有请求会完成。预留：批一直满着、一直转——迭代次数超过 Σ 生成数 时报错；分页：最早的请求越长越大，
    别的都被挤出去，最后它自己也被挤出去、批空了——报错。
    """
    bad = _mutant(paging_lab, "done = run_s == O[run_r]", "done = run_s < 0")
    P, O = [10] * 12, [2, 3] * 6
    with pytest.raises(RuntimeError, match="卡住"):
        bad.simulate_kv_allocation(P, O, 64, policy, reserve=20, block=4, watermark=0.0)


def _stuck_decode_tick(running, t, last, gaps, gap1, out_lens):
    """种下的 bug：一次 decode 迭代谁也没多一个 token。"""
    return 0


def test_disaggregation_simulations_whose_decode_never_advances_raise(monkeypatch):
    monkeypatch.setattr(disagg_lab, "_decode_tick", _stuck_decode_tick)
    arr, P, O = [0.0, 0.01, 0.02], [100, 200, 300], [4, 2, 3]
    with pytest.raises(RuntimeError, match="卡住"):
        simulate_colocated(LLAMA31_8B, H100, arr, P, O)
    with pytest.raises(RuntimeError, match="卡住"):
        simulate_colocated(LLAMA31_8B, H100, arr, P, O, chunk=64)
    with pytest.raises(RuntimeError, match="卡住"):
        simulate_disaggregated(LLAMA31_8B, H100, arr, P, O, lambda n: 1e-3)


def test_fast_simulations_whose_decode_batch_never_advances_raise(monkeypatch):
    monkeypatch.setattr(disagg_lab._DecodeBatch, "run", lambda self, t, t_stop, clock, decode_clock: (t, 0))
    arr, P, O = [0.0, 0.01, 0.02], [100, 200, 300], [4, 2, 3]
    with pytest.raises(RuntimeError, match="卡住"):
        fast_colocated(LLAMA31_8B, H100, arr, P, O)
    with pytest.raises(RuntimeError, match="卡住"):
        fast_disaggregated(LLAMA31_8B, H100, arr, P, O, lambda n: 1e-3, n_prefill=2, n_decode=2)


def test_knee_chunk_whose_iteration_time_ignores_the_chunk_raises(monkeypatch):
    """种下的 bug：iteration_time 不随顺带的 prefill 变大，倍增找上界停不下来。"""
    monkeypatch.setattr(iteration_lab, "iteration_time", lambda *a, **k: 1.0)
    with pytest.raises(RuntimeError, match="停不下来"):
        knee_chunk(LLAMA31_8B, H100, 8, 8000)
