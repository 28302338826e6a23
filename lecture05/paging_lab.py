"""
paging_lab —— KV 内存怎么分：同一串请求、同一块内存，按上限整段预留 vs 按块（分页）随用随分、共享前缀的写时复制，
返回真 token 占分出去的内存的比例、并发、浪费和挤出重算的次数。只数 token 位置，不算时间。

【出处】vLLM / PagedAttention（Kwon et al., SOSP 2023, arXiv 2309.06180）：按块分配、水位线、挤出后重算（recompute）、
共享前缀的满块只存一份、最后一块写时复制。
"""
from collections import deque

import numpy as np

from block_manager_lab import BlockPool   # 课程里只有一个块池：引擎（engine_lab）和这里的模拟共用它的空闲表和引用计数

__all__ = ["simulate_kv_allocation"]


def simulate_kv_allocation(prompt_lens, out_lens, capacity_tokens, policy, reserve=None, block=16,
                           shared_prefix=0, watermark=0.01):
    """
    一块 KV 内存（capacity_tokens 个 token 位置）服务一串请求：全部在 t = 0 排队、先来先服务，每次迭代批里每个请求
    生成一个 token。返回 dict（只统计队列里还有人在等的那些迭代——内存是瓶颈的时候）：
    used_frac（Σ 真 token / Σ 占用的位置）、pool_frac（Σ 真 token / (迭代数 × capacity)）、mean_running、max_running
    （批里的请求数）、mean_tokens（每个在批里的请求平均存着几个 token）、waste_frac（分页：最后一块里空着的位置占占用的
    比例）、mean_waste（分页：平均每个请求最后一块里空着几个位置）、saved_tokens（共享前缀平均省下的位置）、steps、
    preempted（被挤出去重算的次数）；以及（所有迭代，不只排队的那些）max_held：同时分出去的最多的块（分页，
    共享的满块算一份）或位置（预留），pool：内存一共多少块（分页）或位置（预留）——max_held 永远不该超过 pool。

    【推导】请求 r 在批里待 out[r] 次迭代：第 s 次时存着 P + s − 1 个 token 的 KV（第 1 次是 prefill 写进提示的 P 个；
    第 s ≥ 2 次写进第 s − 1 个生成的 token）。"真 token" = 这些位置。
    policy="reserve"：进来时一次预留 reserve[r] 个位置（标量或每个请求一个数），生成完才放；队首放不下就等（不插队）。
    policy="paged"：block 个位置一块，需要时才分一块（vLLM 的做法）；进来时要能放下提示的块、并且剩下的块不少于
    watermark × 总块数（vLLM 的水位线）；已经在批里的请求要新块而没有时，把最后进来的请求挤出去（放掉它的块、
    回到队首、从头重算——vLLM 的 recompute）。共享前缀（shared_prefix > 0，只在分页时）：所有提示的开头
    shared_prefix 个 token 相同，其中满的块只存一份（有请求在用时存在），最后那个不满的块每个请求复制一份（写时复制）。
    【边界】请求不合法（提示、生成数 < 1，数组不一样长）、预留放不下请求自己（reserve < P + out − 1）或超过容量、
    一个请求自己就装不满内存、共享前缀比某个提示长、未知 policy，都抛 ValueError——而不是一直等下去。
    模拟卡住抛 RuntimeError（只会是代码的错，比如块没放回去）：批空着、队首却放不进来（参数检查保证一个请求
    在空内存里总放得下），或者迭代次数超过 Σ out（最早进来的请求从不被挤出去——挤的是最后进来的，而它独自
    总放得下——每一步都向前走一个 token，所以每 out[r] 步至少完成一个请求）。
    """
    P, O = np.asarray(prompt_lens, dtype=np.int64), np.asarray(out_lens, dtype=np.int64)
    n = len(P)
    if n < 1 or len(O) != n or P.min() < 1 or O.min() < 1:
        raise ValueError(f"提示长度和生成数两个数组必须一样长、不空，每个请求的提示至少 1 个 token、至少生成 1 个"
                         f"（收到 {n}, {len(O)} 个）")
    if capacity_tokens < 1 or block < 1 or not 0 <= watermark < 1:
        raise ValueError(f"容量、块大小至少 1，水位线在 [0, 1) 里（收到 {capacity_tokens}, {block}, {watermark}）")
    need = P + O - 1                                    # 一个请求最多同时存着的 token 数
    if policy == "reserve":
        res = np.broadcast_to(np.asarray(reserve if reserve is not None else 0, dtype=np.int64), (n,))
        if (res < need).any() or res.max() > capacity_tokens:
            raise ValueError(f"每个请求的预留要放得下它自己（≥ 提示 + 生成数 − 1），且不超过容量 {capacity_tokens}")
        if shared_prefix:
            raise ValueError("共享前缀要按块分配（policy='paged'）：整段预留的内存没法共享")
    elif policy != "paged":
        raise ValueError(f"未知的分配法 {policy!r}；可选：'reserve'（一次预留）、'paged'（按块随用随分）")
    if shared_prefix < 0 or shared_prefix > P.min():
        raise ValueError(f"共享前缀必须在 0 和最短的提示（{P.min()}）之间（收到 {shared_prefix}）")
    total = capacity_tokens // block if policy == "paged" else capacity_tokens
    wm = int(watermark * total) if policy == "paged" else 0
    shared_blk = shared_prefix // block                 # 只存一份的满块
    s_full = shared_blk * block

    def private_blocks(tokens):                         # 一个请求自己的块（共享的满块不算）
        return -(-(tokens - s_full) // block)
    if policy == "paged" and (private_blocks(need) + shared_blk).max() > total - wm:
        raise ValueError(f"有的请求自己就装不下：最多要 {int((private_blocks(need) + shared_blk).max())} 块，"
                         f"内存只有 {total} 块（水位线留 {wm} 块）")
    pool = BlockPool(int(total)) if policy == "paged" else None
    ids = {}                                            # 分页：请求 -> 它自己的块号
    shared_ids = []                                     # 分页：共享前缀的满块（每个在跑的请求各持一个引用）

    def hold(r, k):                                     # 请求 r 再拿 k 块
        ids.setdefault(r, []).append(pool.take_many(k))

    def release(r):                                     # 请求 r 放掉自己的块和它对共享块的引用
        mine = ids.pop(r, [])
        if mine:
            pool.decref_many(np.concatenate(mine))
        pool.decref_many(np.asarray(shared_ids, dtype=np.int64))
    queue = deque(range(n))
    run_r = np.zeros(0, dtype=np.int64)                 # 批里的请求（按进来的先后）
    run_s = np.zeros(0, dtype=np.int64)                 # 它们各自是第几次迭代
    run_h = np.zeros(0, dtype=np.int64)                 # 分页：各自持有的块；预留：各自预留的位置
    free, steps, preempted = total, 0, 0               # 分页时 free 总是等于 pool.num_free（每次改动后同步）
    iters, max_iters, max_held = 0, int(O.sum()), 0
    sums = {"real": 0, "occupied": 0, "running": 0, "waste": 0, "saved": 0}
    max_running = 0
    while queue or len(run_r):
        iters += 1
        if iters > max_iters:
            raise RuntimeError(f"simulate_kv_allocation：{iters} 次迭代还没做完（最多 Σ 生成数 = {max_iters} 次）："
                               "模拟卡住了，这是代码的错，不是参数的错")
        add_r, add_h = [], []
        while queue:                                   # 先来先服务地放进来
            r = queue[0]
            sharers = len(run_r) + len(add_r)
            h = int(private_blocks(P[r])) if policy == "paged" else int(res[r])
            extra = shared_blk if (policy == "paged" and sharers == 0) else 0
            if free - h - extra < wm:
                break
            queue.popleft()
            free -= h + extra
            if policy == "paged":
                if extra:
                    shared_ids[:] = [int(i) for i in pool.take_many(extra)]
                else:
                    for i in shared_ids:
                        pool.incref(i)
                if h:
                    hold(r, h)
                assert free == pool.num_free
            add_r.append(r)
            add_h.append(h)
        if add_r:
            run_r = np.concatenate([run_r, add_r])
            run_s = np.concatenate([run_s, np.ones(len(add_r), dtype=np.int64)])
            run_h = np.concatenate([run_h, add_h])
        if policy == "paged":                          # 这一步要写的 token 需要新块的，各分一块；不够就挤掉最后进来的
            want = private_blocks(P[run_r] + run_s - 1) - run_h
            while want.sum() > free:                  # 不会挤空：参数检查保证一个请求自己总装得下
                free += int(run_h[-1])
                release(int(run_r[-1]))
                queue.appendleft(int(run_r[-1]))
                run_r, run_s, run_h, want = run_r[:-1], run_s[:-1], run_h[:-1], want[:-1]
                preempted += 1
            free -= int(want.sum())
            tot = int(want.sum())
            if tot:                                    # 一步要的块一次拿齐，再按请求分开
                need = np.flatnonzero(want)
                got, at = pool.take_many(tot), 0
                for j in need:
                    k = int(want[j])
                    ids.setdefault(int(run_r[j]), []).append(got[at:at + k])
                    at += k
            assert free == pool.num_free
            run_h = run_h + want
        if not len(run_r):
            raise RuntimeError(f"simulate_kv_allocation：批空着，队首的请求 {queue[0]} 却放不进来（空着的 {free} / {total}）："
                               "有块没放回去，模拟卡住了——这是代码的错，不是参数的错")
        max_held = max(max_held, int(run_h.sum()) + (shared_blk if policy == "paged" else 0))
        held = P[run_r] + run_s - 1
        if queue and len(run_r):
            k = len(run_r)
            shared_on = shared_blk if policy == "paged" and k else 0
            real = int(held.sum()) - (k - 1) * s_full if shared_on else int(held.sum())
            occupied = (int(run_h.sum()) + shared_on) * block if policy == "paged" else int(run_h.sum())
            steps += 1
            sums["real"] += real
            sums["occupied"] += occupied
            sums["running"] += k
            sums["waste"] += occupied - real if policy == "paged" else 0
            sums["saved"] += (k - 1) * s_full if shared_on else 0
            max_running = max(max_running, k)
        done = run_s == O[run_r]                       # 这一步是它的最后一次迭代
        if done.any():
            free += int(run_h[done].sum())
            if policy == "paged":
                for r in run_r[done]:
                    release(int(r))
            run_r, run_s, run_h = run_r[~done], run_s[~done], run_h[~done]
            if policy == "paged" and shared_blk and not len(run_r):
                free += shared_blk
            if policy == "paged":
                assert free == pool.num_free
        run_s = run_s + 1
    if steps == 0:
        raise ValueError("所有请求一次就都放得下，内存从来不是瓶颈：这个模拟量的是内存放不下时的情形")
    return {"used_frac": sums["real"] / sums["occupied"], "pool_frac": sums["real"] / (steps * total * (
        block if policy == "paged" else 1)), "mean_running": sums["running"] / steps, "max_running": max_running,
            "mean_tokens": (sums["real"] + sums["saved"]) / sums["running"], "waste_frac": sums["waste"] / sums["occupied"],
            "mean_waste": sums["waste"] / sums["running"],
            "saved_tokens": sums["saved"] / steps, "steps": steps, "preempted": preempted,
            "max_held": max_held, "pool": total}
