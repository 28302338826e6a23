"""
paging_lab 的 KV 内存分配模拟：手算的小例子（整段预留、分页的挤出重算、共享前缀的写时复制），
一个逐个请求贪心装箱的独立实现（只生成 1 个 token 的请求：每步一批），以及不合法的输入报 ValueError。
"""
import os
import sys

import numpy as np
import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "lecture05"))

from paging_lab import simulate_kv_allocation  # noqa: E402


def test_reserve_hand_worked():
    """
    容量 100，每个请求预留 40：一次进两个。第 1 步存 10 + 10、第 2 步 11 + 11（都还有人排队）；
    请求 1 第 2 步后生成完，第 3 步请求 2 进来，队列空了，不再统计。
    """
    s = simulate_kv_allocation([10, 10, 10], [3, 2, 4], 100, "reserve", reserve=40)
    assert s["steps"] == 2 and s["max_running"] == 2 and s["mean_running"] == 2
    assert s["used_frac"] == pytest.approx(42 / 160) and s["pool_frac"] == pytest.approx(42 / 200)
    assert s["mean_tokens"] == pytest.approx(42 / 4) and s["preempted"] == 0 and s["waste_frac"] == 0


def test_paged_preemption_hand_worked():
    """
    10 块 × 16、水位线 0；10 个请求，提示 30（2 块）、生成 4：存 30、31、32、33 个 token，第 4 步要第 3 块。
    第一轮 5 个进来占满 10 块；第 4 步 5 个都要新块，只好把最后进来的两个挤出去（剩 3 个各拿一块，空 1 块）。
    第 1–3 步：真 token 150、155、160，占 160；第 4 步 3 × 33 = 99，占 9 × 16 = 144。第二轮（请求 3–7）一模一样。
    第三轮（6–9）进来时队列空了，不统计；直到它的第 4 步又挤出一个（请求 9 回到队列）：那一步再统计一次（99 / 144）。
    一共挤出 2 + 2 + 1 = 5 次。
    """
    s = simulate_kv_allocation([30] * 10, [4] * 10, 160, "paged", block=16, watermark=0.0)
    assert s["steps"] == 9 and s["max_running"] == 5
    runs = 2 * (5 + 5 + 5 + 3) + 3
    assert s["mean_running"] == pytest.approx(runs / 9)
    real, occ = 2 * (150 + 155 + 160 + 99) + 99, 2 * (3 * 160 + 144) + 144
    assert s["used_frac"] == pytest.approx(real / occ) and s["pool_frac"] == pytest.approx(real / (9 * 160))
    assert s["waste_frac"] == pytest.approx((occ - real) / occ)
    assert s["mean_waste"] == pytest.approx((occ - real) / runs)
    assert s["preempted"] == 5


def test_prefix_sharing_hand_worked():
    """
    提示 = 40 个共享 + 10 个自己的，16 个一块：共享的 32 个 token 是 2 个满块（只存一份），剩下 8 + 10 = 18 个各占 2 块。
    20 块：不共享时每个请求 4 块、一步 5 个；共享时 2 + 2k ≤ 20，一步 9 个。只生成 1 个 token：每步换一批。
    """
    P, O = [50] * 20, [1] * 20
    base = simulate_kv_allocation(P, O, 320, "paged", block=16, watermark=0.0)
    assert base["steps"] == 3 and base["mean_running"] == 5 and base["saved_tokens"] == 0
    sh = simulate_kv_allocation(P, O, 320, "paged", block=16, watermark=0.0, shared_prefix=40)
    assert sh["steps"] == 2 and sh["mean_running"] == 9
    assert sh["saved_tokens"] == 8 * 32                              # 9 个请求、满块只存一份
    assert sh["used_frac"] == pytest.approx((32 + 9 * 18) / 320)
    assert sh["mean_tokens"] == pytest.approx(50)


def _greedy_one_step(P, cap_units, cost):
    """独立实现：每个请求只待一步；每步按顺序装，装不下就下一步。返回 (统计的步数, Σ 真 token, Σ 占用, Σ 批大小)。"""
    steps = real = occ = runs = 0
    i = 0
    while i < len(P):
        used, batch = 0, []
        while i < len(P) and used + cost(P[i]) <= cap_units:
            used += cost(P[i])
            batch.append(P[i])
            i += 1
        if i < len(P):                                  # 还有人在排队：统计这一步
            steps += 1
            real += sum(batch)
            occ += used
            runs += len(batch)
    return steps, real, occ, runs


@pytest.mark.parametrize("block", [1, 16, 48])
def test_paged_waste_is_exactly_the_last_partial_block(block):
    P = (1 + np.floor(np.random.default_rng(5).random(300) * 200)).astype(int).tolist()
    cap_blocks = max(40, 600 // block)
    s = simulate_kv_allocation(P, [1] * len(P), cap_blocks * block, "paged", block=block, watermark=0.0)
    steps, real, occ, runs = _greedy_one_step(P, cap_blocks, lambda p: -(-p // block))
    occ_tokens = occ * block
    assert s["steps"] == steps and s["used_frac"] == pytest.approx(real / occ_tokens, rel=1e-12)
    assert s["waste_frac"] == pytest.approx((occ_tokens - real) / occ_tokens, rel=1e-12)
    # 最后一块的空位逐个请求算：Σ ((−P) mod block)
    assert s["mean_waste"] * runs == pytest.approx(occ_tokens - real, rel=1e-12)
    if block == 1:
        assert s["waste_frac"] == 0


def test_reserve_matches_the_greedy_packing():
    P = (1 + np.floor(np.random.default_rng(6).random(200) * 300)).astype(int)
    s = simulate_kv_allocation(P, [1] * len(P), 2000, "reserve", reserve=P + 100)
    steps, real, occ, runs = _greedy_one_step(P.tolist(), 2000, lambda p: p + 100)
    assert s["steps"] == steps and s["used_frac"] == pytest.approx(real / occ, rel=1e-12)
    assert s["mean_running"] == pytest.approx(runs / steps)


def test_kv_allocation_rejects_bad_inputs_instead_of_hanging():
    ok = dict(prompt_lens=[10, 10], out_lens=[2, 2], capacity_tokens=20)
    cases = [
        (dict(ok, out_lens=[2, 0], policy="paged"), "至少生成 1 个"),
        (dict(ok, prompt_lens=[0, 10], policy="paged"), "至少 1 个 token"),
        (dict(ok, out_lens=[2], policy="paged"), "一样长"),
        (dict(ok, policy="reserve", reserve=10), "放得下它自己"),
        (dict(ok, policy="reserve", reserve=30), "不超过容量"),
        (dict(ok, policy="fifo"), "未知的分配法"),
        (dict(ok, policy="paged", shared_prefix=11), "共享前缀"),
        (dict(ok, policy="reserve", reserve=12, shared_prefix=4), "共享前缀"),
        (dict(ok, capacity_tokens=8, policy="paged", block=4), "自己就装不下"),
        (dict(ok, capacity_tokens=0, policy="paged"), "容量"),
        (dict(ok, policy="paged", block=0), "块大小"),
        (dict(ok, policy="paged", watermark=1.0), "水位线"),
        (dict(ok, capacity_tokens=1000, policy="paged", block=4), "都放得下"),
    ]
    for kw, msg in cases:
        with pytest.raises(ValueError, match=msg):
            simulate_kv_allocation(**kw)
