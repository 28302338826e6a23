"""
disagg_lab —— prefill 和 decode 同机 vs 解耦：一串请求按到达时刻走过一台（或几台）机器，返回每个请求的 TTFT、TPOT、
token 间隔和完成时刻。

两套实现、同样的规则和结果：simulate_colocated / simulate_disaggregated 逐个序列记账（好读，第 5 讲 02 用）；
fast_colocated / fast_disaggregated 把两个事件之间的纯 decode 迭代一次算完，还能有多台 prefill / decode 机
（第 5 讲 06 扫到达率时用；测试逐个请求核对两者相等）。SLO 达标率和 goodput 在 goodput_lab。

【约定】每次迭代的时间是 iteration_lab.iteration_time（roofline 下界；快速版用逐位相等的 iteration_clock），
只接受稠密、没有滑动窗口的模型。模拟是确定的：同样的输入、同样的结果。
每个循环都有一个由输入算出的圈数上限（_Watchdog）：代码坏了、模拟不再前进时抛 RuntimeError，而不是一直转下去。
"""
import heapq
import math
from collections import deque

import numpy as np

from iteration_lab import iteration_clock, iteration_time

__all__ = ["simulate_colocated", "simulate_disaggregated", "fast_colocated", "fast_disaggregated"]


# ---------------------------------------------------------------------------
# 逐个序列记账的模拟
# ---------------------------------------------------------------------------
def _finish(first, last, gaps, gap1, arrivals, out_lens):
    """把每个请求的首 token 时刻、末 token 时刻、最大间隔、第 1→2 个 token 的间隔整理成结果 dict。"""
    first, last, gaps = np.asarray(first), np.asarray(last), np.asarray(gaps)
    n_out = np.asarray(out_lens, dtype=float)
    tpot = np.where(n_out > 1, (last - first) / np.maximum(n_out - 1, 1), 0.0)
    return {"ttft": first - np.asarray(arrivals), "tpot": tpot, "max_gap": gaps, "first_gap": np.asarray(gap1),
            "finish": last}


def simulate_colocated(model, chip, arrivals, prompt_lens, out_lens, n_gpus=1, chunk=None):
    """
    同机部署：n_gpus 台机器，每台既做 prefill 也做 decode；请求按到达顺序轮流分给各台（第 i 个给第 i mod n_gpus 台）。
    返回 dict（每个请求一个数的数组，按请求编号）：ttft（首 token 时刻 − 到达）、tpot（(末 token − 首 token)/(生成数 − 1)）、
    max_gap（相邻两个 token 之间最长的等待）、first_gap（第 1 个到第 2 个 token 的间隔）、finish（末 token 时刻）。
    只生成 1 个 token 的请求：tpot、max_gap、first_gap 都记 0。

    【推导】每台机器一次迭代一次迭代地跑（时间 = iteration_time）：
    chunk=None（prefill 优先）：有等着的请求，就先把排在最前面的那个的整个提示 prefill 掉（这次迭代不 decode），
    它的第一个 token 在迭代结束时出来；没有等着的，所有在跑的序列 decode 一步。
    chunk=c（分块 prefill，Sarathi 的做法）：每次迭代 decode 所有在跑的序列，同时顺带 prefill 排在最前面的请求的
    下 c 个提示 token；提示算完的那次迭代给出它的第一个 token。
    【边界】机器空闲时时间跳到下一个到达时刻。请求的数组长度不一、提示或生成数 < 1、到达时刻不是有限非负的不减序列、n_gpus < 1、chunk < 1 抛 ValueError。
    模拟卡住（循环的圈数超过 _Watchdog 的上限，只会是代码的错）抛 RuntimeError，而不是一直转下去。
    """
    _check_requests(arrivals, prompt_lens, out_lens)
    if n_gpus < 1 or (chunk is not None and chunk < 1):
        raise ValueError(f"机器至少 1 台、分块至少 1 个 token（收到 n_gpus={n_gpus}, chunk={chunk}）")
    n = len(arrivals)
    first, last, gaps, gap1 = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    for g in range(n_gpus):
        mine = list(range(g, n, n_gpus))
        nxt, t = 0, 0.0
        waiting, running = deque(), {}              # running: 请求编号 -> 已生成的 token 数
        done_prefill = 0                            # 等待队首的请求已经 prefill 的提示 token 数（分块时用）
        finished, dog = 0, _Watchdog("simulate_colocated", [prompt_lens[r] for r in mine], [out_lens[r] for r in mine])
        while finished < len(mine):
            dog.tick()
            while nxt < len(mine) and arrivals[mine[nxt]] <= t:
                waiting.append(mine[nxt])
                nxt += 1
            if not waiting and not running:
                t = float(arrivals[mine[nxt]])
                continue
            ctx_sum = sum(int(prompt_lens[r]) + k for r, k in running.items())
            if chunk is None:
                if waiting:
                    r = waiting.popleft()
                    t += iteration_time(model, chip, prefill_tokens=int(prompt_lens[r]))
                    new, decode = [r], False
                else:
                    new, decode = [], True
                    t += iteration_time(model, chip, len(running), ctx_sum)
            else:
                c, new = 0, []
                if waiting:
                    c = min(chunk, int(prompt_lens[waiting[0]]) - done_prefill)
                t += iteration_time(model, chip, len(running), ctx_sum, prefill_tokens=c, prefill_prefix=done_prefill)
                decode = bool(running)
                if waiting:
                    done_prefill += c
                    if done_prefill == int(prompt_lens[waiting[0]]):
                        new, done_prefill = [waiting.popleft()], 0
            if decode:
                finished += _decode_tick(running, t, last, gaps, gap1, out_lens)
            for r in new:
                first[r] = last[r] = t
                if int(out_lens[r]) == 1:
                    finished += 1
                else:
                    running[r] = 1
    return _finish(first, last, gaps, gap1, arrivals, out_lens)


def simulate_disaggregated(model, chip, arrivals, prompt_lens, out_lens, kv_time):
    """
    解耦部署：一台机器只做 prefill（先来先服务，一次一个提示），另一台只做 decode（连续批）。返回值同 simulate_colocated。

    【推导】prefill 机：开始 = max(到达, 上一个做完)，结束 = 开始 + iteration_time(提示)，第一个 token 在结束时出来；
    然后把 KV cache 搬到 decode 机，用时 kv_time(提示长度)（秒）。decode 机：每次迭代开始前把已经到达的请求放进批，
    批里所有序列 decode 一步；空闲时跳到下一个请求到达的时刻。
    【参数】kv_time：函数，提示长度 → 搬 KV 的秒数（例如 link_time(model.kv_bytes(n), IB_NDR)）。
    【边界】同 simulate_colocated（包括卡住时的 RuntimeError）。
    """
    _check_requests(arrivals, prompt_lens, out_lens)
    n = len(arrivals)
    first, last, gaps, gap1 = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    ready = []
    free = 0.0
    for r in range(n):
        start = max(float(arrivals[r]), free)
        free = start + iteration_time(model, chip, prefill_tokens=int(prompt_lens[r]))
        first[r] = last[r] = free
        ready.append(free + kv_time(int(prompt_lens[r])))
    order = sorted((r for r in range(n) if int(out_lens[r]) > 1), key=lambda r: (ready[r], r))
    t, nxt, running = 0.0, 0, {}
    dog = _Watchdog("simulate_disaggregated", [], [out_lens[r] for r in order])
    while nxt < len(order) or running:
        dog.tick()
        while nxt < len(order) and ready[order[nxt]] <= t:
            running[order[nxt]] = 1
            nxt += 1
        if not running:
            t = ready[order[nxt]]
            continue
        ctx_sum = sum(int(prompt_lens[r]) + k for r, k in running.items())
        t += iteration_time(model, chip, len(running), ctx_sum)
        _decode_tick(running, t, last, gaps, gap1, out_lens)
    return _finish(first, last, gaps, gap1, arrivals, out_lens)


def _check_requests(arrivals, prompt_lens, out_lens):
    n = len(arrivals)
    if n < 1 or len(prompt_lens) != n or len(out_lens) != n:
        raise ValueError(f"到达时刻、提示长度、生成数三个数组必须一样长且不空（收到 {n}, {len(prompt_lens)}, {len(out_lens)}）")
    if min(int(x) for x in prompt_lens) < 1 or min(int(x) for x in out_lens) < 1:
        raise ValueError("每个请求的提示至少 1 个 token、至少生成 1 个 token")
    arr = np.asarray(arrivals, dtype=float)
    if not (np.isfinite(arr).all() and (arr >= 0).all() and (np.diff(arr) >= 0).all()):
        raise ValueError("到达时刻必须是有限、非负、不减的秒数（按到达顺序排好；NaN 会让模拟一直等下去）")


def _decode_tick(running, t, last, gaps, gap1, out_lens):
    """
    一次 decode 迭代在时刻 t 结束：running 里每个序列多了一个 token。记下每个请求相邻两个 token 的最长间隔（gaps）
    和第一、二个 token 的间隔（gap1），生成完的移出 running。返回这一步生成完的请求数。
    """
    done = 0
    for r in list(running):
        running[r] += 1
        gaps[r] = max(gaps[r], t - last[r])
        if running[r] == 2:
            gap1[r] = t - last[r]
        last[r] = t
        if running[r] == int(out_lens[r]):
            del running[r]
            done += 1
    return done


class _Watchdog:
    """
    一台机器上的模拟循环的看门狗：每转一圈调一次 tick()，圈数超过由输入算出的上限就抛 RuntimeError
    （模拟卡住了，这是代码的错，不是参数的错），而不是一直转下去。

    【推导】每一圈要么让时间跳到下一个请求到达（之后那一圈一定收进它：每个请求最多一次）、要么 prefill 掉至少一个
    提示 token（不分块时是整个提示：每个请求一次）、要么让批里每个序列各多一个 token（最多 Σ 生成数 圈）。
    所以圈数 ≤ 2·请求数 + Σ 提示 + Σ 生成数。只 decode 的循环（解耦的 decode 机）传空的 prompt_lens。
    """

    def __init__(self, name, prompt_lens, out_lens):
        self.name, self.n = name, 0
        self.bound = 2 * len(out_lens) + sum(int(x) for x in prompt_lens) + sum(int(x) for x in out_lens)

    def tick(self):
        self.n += 1
        if self.n > self.bound:
            raise RuntimeError(f"{self.name}：转了 {self.n} 圈还没做完，超过了上限 {self.bound}（2·请求数 + Σ 提示 + "
                               "Σ 生成数）：模拟卡住了，这是代码的错，不是参数的错")


# ---------------------------------------------------------------------------
# 快速版：两个事件之间的纯 decode 迭代一次算完，多台机器
# ---------------------------------------------------------------------------
class _DecodeBatch:
    """
    一台机器上连续批处理的 decode 状态，不逐个序列地记账：所有在跑的序列每次 decode 迭代各多一个 token，
    所以只记"在跑几个"（n）、"上下文之和"（ctx = Σ(提示 + 已生成)，iteration_time 的 decode_context_sum）
    和每个序列在第几次 decode 迭代结束（堆）。两个事件之间（没有请求进来、没有请求生成完）的一串纯 decode
    迭代一次用 numpy 算完（run）。每个请求的间隔在最后（gaps_into）一次算出。
    """

    def __init__(self, prompt_lens, out_lens, first, last):
        self.prompt, self.out, self.first, self.last = prompt_lens, out_lens, first, last
        self.n, self.ctx, self.k, self.peak_ctx = 0, 0, 0, 0
        self.heap, self.times, self.span = [], [], {}    # times[j]：第 j+1 次 decode 迭代结束的时刻；span：r -> (k0, k1)

    def join(self, r, t):
        """请求 r 在时刻 t 给出第一个 token、进入批（它还要 decode 生成数 − 1 次）。返回 1 表示它已经生成完。"""
        self.first[r] = self.last[r] = t
        if self.out[r] == 1:
            return 1
        heapq.heappush(self.heap, (self.k + self.out[r] - 1, r, self.k))
        self.n += 1
        self.ctx += self.prompt[r] + 1
        self.peak_ctx = max(self.peak_ctx, self.ctx)
        return 0

    def _advance(self, times):
        """len(times) 次 decode 迭代在这些时刻结束；把到点的请求移出。返回生成完的请求数。"""
        self.times.extend(times)
        self.ctx += self.n * len(times)
        self.k += len(times)
        done = 0
        while self.heap and self.heap[0][0] == self.k:
            _, r, k0 = heapq.heappop(self.heap)
            self.last[r] = self.times[-1]
            self.span[r] = (k0, self.k)
            self.n -= 1
            self.ctx -= self.prompt[r] + self.out[r]
            done += 1
        return done

    def tick(self, t):
        """一次 decode 迭代在时刻 t 结束（和 prefill 混在一起的那种迭代用它）。"""
        return self._advance([t])

    def run(self, t, t_stop, clock, decode_clock):
        """
        从时刻 t 起连着做纯 decode 迭代，直到批里有请求生成完，或者某次迭代结束时已经 ≥ t_stop（下一个请求到了）。
        返回 (结束时刻, 生成完的请求数)。时刻逐次累加，和一步一步地加逐位相同（cumsum 从 t 起依次加）。
        上下文只增不减，每步不比第一步短：到 t_stop 最多 (t_stop − t) / 第一步 + 1 步，只算这么多
        （算少了也没关系：调用者会再调一次）；只有几步时逐步算，比 numpy 快。
        """
        m = self.heap[0][0] - self.k
        if t_stop < math.inf:
            m = min(m, int((t_stop - t) / clock(self.n, self.ctx)) + 2)
        if m <= 8:
            times, ctx = [], self.ctx
            for _ in range(m):
                t += clock(self.n, ctx)
                times.append(t)
                ctx += self.n
                if t >= t_stop:
                    break
        else:
            ctxs = self.ctx + self.n * np.arange(m, dtype=np.int64)
            times = np.cumsum(np.concatenate(([t], decode_clock(self.n, ctxs))))[1:]
            if t_stop < math.inf:
                times = times[:int(np.searchsorted(times, t_stop, side="left")) + 1]
            times = times.tolist()
        return times[-1], self._advance(times)

    def gaps_into(self, gaps, gap1):
        """每个走完的请求：第 1→2 个 token 的间隔（gap1）和相邻两个 token 的最长间隔（gaps）。"""
        times = np.asarray(self.times)
        steps = np.diff(times)
        for r, (k0, k1) in self.span.items():
            gap1[r] = times[k0] - self.first[r]
            gaps[r] = max(gap1[r], float(steps[k0:k1 - 1].max(initial=0.0)))


def fast_colocated(model, chip, arrivals, prompt_lens, out_lens, chunk=None):
    """
    simulate_colocated 的精简版（一台机器，n_gpus = 1）：同样的调度规则、同样的迭代时间，返回同样的 dict
    （ttft、tpot、max_gap、first_gap、finish），外加 peak_ctx（批里上下文之和的最大值 = 同时存着的 KV 位置数）。

    【推导】见 simulate_colocated；不同的只是记账：decode 批用 _DecodeBatch，两个事件之间的纯 decode 迭代一次算完，
    而不是把每个序列各加一遍（测试逐个请求核对两者相等）。
    【边界】同 simulate_colocated（请求不合法、chunk < 1 抛 ValueError；卡住时抛 RuntimeError）。
    """
    _check_requests(arrivals, prompt_lens, out_lens)
    if chunk is not None and chunk < 1:
        raise ValueError(f"分块至少 1 个 token（收到 chunk={chunk}）")
    n = len(arrivals)
    arr = [float(a) for a in arrivals]
    P, O = [int(x) for x in prompt_lens], [int(x) for x in out_lens]
    first, last, gaps, gap1 = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    b = _DecodeBatch(P, O, first, last)
    clock, decode_clock = iteration_clock(model, chip)
    nxt, t, finished, done_prefill = 0, 0.0, 0, 0
    waiting = deque()
    dog = _Watchdog("fast_colocated", P, O)
    while finished < n:
        dog.tick()
        while nxt < n and arr[nxt] <= t:
            waiting.append(nxt)
            nxt += 1
        if not waiting and not b.n:
            t = arr[nxt]
            continue
        new = None
        if not waiting:
            t, done = b.run(t, arr[nxt] if nxt < n else math.inf, clock, decode_clock)
            finished += done
        elif chunk is None:
            new = waiting.popleft()
            t += clock(prefill_tokens=P[new])
        else:
            c = min(chunk, P[waiting[0]] - done_prefill)
            t += clock(b.n, b.ctx, c, done_prefill)
            if b.n:
                finished += b.tick(t)
            done_prefill += c
            if done_prefill == P[waiting[0]]:
                new, done_prefill = waiting.popleft(), 0
        if new is not None:
            finished += b.join(new, t)
    b.gaps_into(gaps, gap1)
    res = _finish(first, last, gaps, gap1, arrivals, out_lens)
    res["peak_ctx"] = b.peak_ctx
    return res


def fast_disaggregated(model, chip, arrivals, prompt_lens, out_lens, kv_time, n_prefill=1, n_decode=1):
    """
    解耦部署，n_prefill 台 prefill 机 + n_decode 台 decode 机；n_prefill = n_decode = 1 时和 simulate_disaggregated
    完全相同（测试逐个请求核对）。返回值同 fast_colocated（peak_ctx 取各台 decode 机里最大的）。

    【推导】prefill：请求按到达顺序先来先服务，交给最早空下来的那台（同时空下来时编号小的），
    一次一个提示，结束时给出第一个 token，再搬 KV（kv_time(提示长度) 秒）。decode：生成数 > 1 的请求按
    KV 到达 decode 侧的先后（同时到达按请求编号）轮流分给各台 decode 机（第 i 个给第 i mod n_decode 台），
    每台连续批处理，同 simulate_disaggregated。
    【边界】请求不合法、机器数 < 1 抛 ValueError；卡住时抛 RuntimeError（同 simulate_colocated）。
    """
    _check_requests(arrivals, prompt_lens, out_lens)
    if n_prefill < 1 or n_decode < 1:
        raise ValueError(f"prefill 机和 decode 机都至少 1 台（收到 {n_prefill}, {n_decode}）")
    n = len(arrivals)
    P, O = [int(x) for x in prompt_lens], [int(x) for x in out_lens]
    first, last, gaps, gap1 = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    clock, decode_clock = iteration_clock(model, chip)
    free = [(0.0, i) for i in range(n_prefill)]          # (空下来的时刻, 机器编号)
    t_pre, ready = {}, [0.0] * n
    for r in range(n):
        f, i = heapq.heappop(free)
        if P[r] not in t_pre:
            t_pre[P[r]] = clock(prefill_tokens=P[r])
        end = max(float(arrivals[r]), f) + t_pre[P[r]]
        heapq.heappush(free, (end, i))
        first[r] = last[r] = end
        ready[r] = end + kv_time(P[r])
    order = sorted((r for r in range(n) if O[r] > 1), key=lambda r: (ready[r], r))
    peak = 0
    for d in range(n_decode):
        mine = order[d::n_decode]
        b = _DecodeBatch(P, O, first, last)
        nxt, t, finished = 0, 0.0, 0
        dog = _Watchdog("fast_disaggregated", [], [O[r] for r in mine])
        while finished < len(mine):
            dog.tick()
            while nxt < len(mine) and ready[mine[nxt]] <= t:
                b.join(mine[nxt], first[mine[nxt]])
                nxt += 1
            if not b.n:
                t = ready[mine[nxt]]
                continue
            t, done = b.run(t, ready[mine[nxt]] if nxt < len(mine) else math.inf, clock, decode_clock)
            finished += done
        b.gaps_into(gaps, gap1)
        peak = max(peak, b.peak_ctx)
    res = _finish(first, last, gaps, gap1, arrivals, out_lens)
    res["peak_ctx"] = peak
    return res
