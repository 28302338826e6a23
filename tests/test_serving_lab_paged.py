"""
paging_lab 的 KV 内存分配模拟：手算的小例子（整段预留、分页的挤出重算、共享前缀的写时复制、共享前缀的请求在不同的
步完成），一个逐个请求贪心装箱的独立实现（只生成 1 个 token 的请求：每步一批），一个逐个请求记账、共享块用引用计数的
独立分页实现（随机的小例子和第 5 讲 07 演示 2 的数字），分出去的块永远不超过内存，以及不合法的输入报 ValueError。
"""
import os
import sys
from collections import deque

import numpy as np
import pytest

from conftest import ROOT, load_script

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


# ---- 共享前缀的块：最后一个用它的请求完成时才放回去 ----
def test_shared_prefix_blocks_are_freed_only_when_the_last_sharer_finishes():
    """
    回归：共享前缀的满块在**每个**请求完成时都放回去（而不是最后一个共享它的请求完成时），内存就分出了比它还多的块
    （第 5 讲 07 的并发从 198 变成 247），而测试全绿。手算：5 块 × 4 个 token，水位线 0；提示 10 = 共享的 8 个
    （2 个满块）+ 自己的 2 个（1 块），生成数 [1, 2, 3, 2, 2]，最多存 12 个 token，一直只要自己的 1 块。
    第 1 步：请求 0、1、2 进来（2 + 1 + 1 + 1 = 5 块，满了），请求 0 完成，放回 1 块。
    第 2 步：请求 3 进来（共享块已经在，只要 1 块；5 块又满了），请求 4 等着；请求 1 完成。
    第 3 步：请求 4 进来，队列空了（不再统计）；请求 2、3 完成。第 4 步：请求 4 完成，批空了，共享的 2 块才放回去。
    每一步都正好 5 块——错的版本在第 1 步后放回 1 + 2 块，第 2 步请求 3、4 一起进来：6 块 > 5 块。
    """
    s = simulate_kv_allocation([10] * 5, [1, 2, 3, 2, 2], 20, "paged", block=4, shared_prefix=8, watermark=0.0)
    assert s["pool"] == 5 and s["max_held"] == 5
    assert s["steps"] == 2 and s["max_running"] == 3 and s["mean_running"] == 3 and s["preempted"] == 0
    # 第 1 步存 10、10、10 个 token，第 2 步 11、11、10；共享的 8 个只存一份：真 token 14、16，占 5 块 = 20 个位置
    assert s["used_frac"] == pytest.approx((14 + 16) / 40) and s["saved_tokens"] == 2 * 8
    assert s["mean_tokens"] == pytest.approx((30 + 32) / 6)


def _reference_paged(P, O, total, block, shared_prefix=0, watermark=0.0):
    """
    独立实现（第二条代码路径）：每个请求一条记录 [编号, 第几次迭代, 自己的块]，共享的满块记引用计数（在用它的请求数），
    计数回到 0 时才放回去；其余规则同 simulate_kv_allocation 的说明（先来先服务、水位线、挤出最后进来的重算，
    只统计还有人排队的迭代）。返回和它同名的几个统计，外加每一步分出去的块数的最大值（max_held）。
    """
    s_blocks = shared_prefix // block
    s_tok = s_blocks * block
    wm = int(watermark * total)
    free, refs, queue, running = total, 0, deque(range(len(P))), []
    steps = preempted = max_held = max_running = 0
    real = occupied = runs = saved = 0

    def own(tokens):                                    # 自己的块：共享的满块之外的 token 要几块
        return -(-(tokens - s_tok) // block)
    while queue or running:
        while queue:
            cost = own(P[queue[0]]) + (s_blocks if refs == 0 else 0)
            if free - cost < wm:
                break
            r = queue.popleft()
            free -= cost
            refs += 1
            running.append([r, 1, own(P[r])])
        want = [own(P[r] + k - 1) - h for r, k, h in running]
        while sum(want) > free:
            r, _, h = running.pop()
            want.pop()
            free += h
            refs -= 1
            queue.appendleft(r)
            preempted += 1
        for e, w in zip(running, want):
            e[2] += w
            free -= w
        held_blocks = sum(h for _, _, h in running) + (s_blocks if refs else 0)
        assert held_blocks + free == total              # 块不多不少
        max_held = max(max_held, held_blocks)
        if queue and running:
            k = len(running)
            tokens = sum(P[r] + i - 1 for r, i, _ in running)
            steps += 1
            runs += k
            max_running = max(max_running, k)
            real += tokens - (k - 1) * s_tok
            saved += (k - 1) * s_tok
            occupied += held_blocks * block
        still = []
        for e in running:
            if e[1] == O[e[0]]:
                free += e[2]
                refs -= 1
                if refs == 0:
                    free += s_blocks
            else:
                e[1] += 1
                still.append(e)
        running = still
    return {"steps": steps, "mean_running": runs / steps, "max_running": max_running, "used_frac": real / occupied,
            "mean_tokens": (real + saved) / runs, "saved_tokens": saved / steps, "preempted": preempted,
            "max_held": max_held}


def _assert_same(s, ref):
    for key, v in ref.items():
        assert s[key] == pytest.approx(v, rel=1e-12), key


@pytest.mark.parametrize("seed", range(6))
def test_paged_matches_the_reference_and_never_hands_out_more_blocks_than_exist(seed):
    """随机的小例子（会挤出、会共享、请求在不同的步完成）：和独立实现逐项相等，分出去的块从不超过内存。"""
    rng = np.random.default_rng(seed)
    n, block = 40, (4, 8, 16)[seed % 3]
    shared = int((1 + 3 * rng.random()) * block) if seed % 2 else 0   # 奇数种子：1 到 3 个共享的满块，加上零头
    P = (shared + 1 + np.floor(rng.random(n) * 5 * block)).astype(int).tolist()
    O = (1 + np.floor(rng.random(n) * 3 * block)).astype(int).tolist()
    total = 30
    s = simulate_kv_allocation(P, O, total * block, "paged", block=block, shared_prefix=shared, watermark=0.05)
    ref = _reference_paged(P, O, total, block, shared, 0.05)
    _assert_same(s, ref)
    assert s["max_held"] <= s["pool"] == total


def test_reserve_never_reserves_more_than_the_capacity():
    P = (1 + np.floor(np.random.default_rng(8).random(100) * 300)).astype(int)
    O = (1 + np.floor(np.random.default_rng(9).random(100) * 100)).astype(int)
    s = simulate_kv_allocation(P, O, 3000, "reserve", reserve=P + O)
    assert s["pool"] == 3000 and 3000 - 400 < s["max_held"] <= 3000


def test_demo2_prefix_sharing_figures_match_the_reference():
    """
    第 5 讲 07 演示 2 打印的数（平均并发 122 → 198，1.62 倍；最多并发 206；每个请求的上下文 3910；平均省下 38.4 GB）
    用独立实现重算一遍：同样 600 个请求、1500 个 token 的系统提示、487,819 个 token 位置 = 30,488 块 × 16。
    """
    from test_lecture05_07 import demo_numbers
    s07 = load_script("lecture05/07_paged_kv_cache.py")
    r = demo_numbers("demo2_prefix_sharing")     # 07 的演示 2 返回的数：脚本成对运行时存下的（test_lecture05_07 也读它）
    P, O = (s07.PROMPTS + 1500).tolist(), s07.OUTS.tolist()
    total = 487_819 // 16
    base = _reference_paged(P, O, total, 16, 0, 0.01)
    shared = _reference_paged(P, O, total, 16, 1500, 0.01)
    _assert_same(r["base"], base)
    _assert_same(r["shared"], shared)
    for s in (r["base"], r["shared"]):
        assert s["max_held"] <= s["pool"] == total
    assert f"{base['mean_running']:.0f}" == "122" and f"{shared['mean_running']:.0f}" == "198"
    assert shared["max_running"] == 206 and f"{shared['mean_tokens']:.0f}" == "3910"
    assert f"{shared['mean_running'] / base['mean_running']:.2f}" == "1.62"
    assert f"{shared['saved_tokens'] * 131072 / 1e9:.1f}" == "38.4"
