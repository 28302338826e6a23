"""
serving_lab —— 服务引擎的账：一次迭代（decode 一批 + 一段 prefill）的 roofline 时间、跨机器搬数据的时间，
以及第 5 讲用的几个小模拟（静态批 vs 连续批、prefill / decode 同机 vs 解耦）。
多卡合成（gang）在 ../lecture01/hw_specs；权重字节、显存装得下的批、compute-bound 的批和临界上下文在 ../lecture01/llm_math。

【约定】
- 时间都是 **roofline 下界**（llm_math.decode_step / prefill_time 的口径）：max(FLOPs / 峰值算力, 字节 / 带宽)，
  没有固定开销、没有通信；需要开销的地方（第 5 讲 04、种子 05 的玩具模型）用 step_time 显式加上。
- n 块卡合成一块（gang）是**理想张量并行**的假设：带宽、容量、算力都乘 n，卡间通信不要钱。
- 模拟是确定的：随机数只用 np.random.default_rng(seed).random()，自己反查 CDF；同样的种子、同样的结果。
- iteration_time 和两个 prefill / decode 模拟只接受稠密、没有滑动窗口的模型（Llama 这一族）：
  它们把一批序列的上下文加起来算 KV 字节和注意力 FLOPs，这只在每层都看全部位置时成立。

【出处】硬件数字见 ../lecture01/hw_specs（互联表在它的末尾）；模型结构见 ../lecture01/llm_math。
"""
import heapq
import math
from collections import deque

import numpy as np

__all__ = ["iteration_time", "link_time", "step_time", "poisson_arrivals", "uniform_ints",
           "simulate_batching", "simulate_colocated", "simulate_disaggregated"]
__all__ += ["fast_colocated", "fast_disaggregated", "slo_attainment", "find_goodput", "prefill_capacity",
            "knee_chunk"]
__all__ += ["simulate_kv_allocation"]


# ---------------------------------------------------------------------------
# 算账
# ---------------------------------------------------------------------------
def iteration_time(model, chip, n_decode=0, decode_context_sum=0, prefill_tokens=0, prefill_prefix=0,
                   w_bits=16.0, kv_bits=16.0, dtype="bf16"):
    """
    服务引擎一次迭代（一次前向）的 roofline 时间：n_decode 个序列各 decode 一个 token，外加（可选）一段 prefill。

    【推导】权重读一遍：W = active_params × w_bits / 8（和 decode_step 一样不含输入词嵌入）。decode 部分同
    llm_math.decode_step：FLOPs = n·2·matmul + 4·h·d_h·层数·ΣL，读 KV = ΣL 个位置的 K、V。
    prefill 部分：一个请求的第 prefix+1 .. prefix+c 个提示 token（c = prefill_tokens），
    FLOPs = 2·(matmul − lm_head)·c + 2·lm_head（lm_head 只算这一段的最后一个位置，同 llm_math.prefill_step）
    + 4·h·d_h·层数·Σ_{i=prefix+1..prefix+c} i（因果），读已经算好的 prefix 个位置的 KV。
    时间 = max(总 FLOPs / 峰值, 总字节 / 带宽)。
    【参数】decode_context_sum：这批 decode 序列的上下文长度之和 ΣL；L 是这个序列的新位置要看的位置数（含它自己），
    和 llm_math.decode_step 的 context 同一个口径。
    prefill_prefix = 0、n_decode = 0 时就是 llm_math.prefill_time；prefill_tokens = 0 时就是 decode_step。
    【边界】只对稠密、没有滑动窗口的模型（见模块说明）；什么都不做的迭代抛 ValueError。
    """
    if model.is_moe or model.sliding_window:
        raise ValueError(f"{model.name}：iteration_time 只对稠密、没有滑动窗口的模型")
    if n_decode < 0 or prefill_tokens < 0 or prefill_prefix < 0 or decode_context_sum < 0:
        raise ValueError("token 数和上下文都不能为负")
    if n_decode == 0 and prefill_tokens == 0:
        raise ValueError("一次迭代至少要 decode 一个序列或 prefill 一个 token")
    attn = 4 * model.n_heads * model.head_dim * model.n_layers       # 每个 (query, 位置) 对的 FLOPs
    kv_pos = model.kv_bytes_per_token(kv_bits / 8)                    # 每个位置的 K、V 字节（所有层）
    c, p = prefill_tokens, prefill_prefix
    pairs = c * p + c * (c + 1) // 2                                  # Σ_{i=p+1..p+c} i
    head = model.vocab * model.d_model
    flops = (2 * model.matmul_params() * n_decode + (2 * (model.matmul_params() - head) * c + 2 * head if c else 0)
             + attn * (decode_context_sum + pairs))
    nbytes = model.active_params() * w_bits / 8 + kv_pos * (decode_context_sum + (p if c else 0))
    return max(flops / chip.peak_flops(dtype), nbytes / chip.mem_bw)


def link_time(nbytes, link, n_links=1):
    """
    把 nbytes 字节经 n_links 条同样的链路（并行、各走一份）单向送过去的时间 = nbytes / (n_links × 单向带宽)。

    【边界】不含延迟和协议开销（它们对几百 MB 的 KV 可以忽略，对几 KB 的消息不能）。
    """
    if nbytes < 0 or n_links < 1:
        raise ValueError(f"字节数不能为负、链路至少 1 条（收到 {nbytes}, {n_links}）")
    return nbytes / (n_links * link.bw)


def step_time(nbytes, bw, overhead, efficiency=0.8):
    """
    种子 05 的玩具模型：一步的时间 = 固定开销 + 读的字节 / (带宽 × 效率)。

    【参数】overhead（秒）和 efficiency（实际能用到峰值带宽的比例）都是**假设值**：种子 05 用 GPU 草稿 0.3 ms、
    GPU 目标 1.5 ms、SRAM 芯片 0.05 ms，效率 0.8。
    """
    return overhead + nbytes / (bw * efficiency)


# ---------------------------------------------------------------------------
# 确定的随机数
# ---------------------------------------------------------------------------
def poisson_arrivals(rate, n, seed):
    """
    泊松过程的前 n 个到达时刻（秒，递增）：间隔是均值 1/rate 的指数分布，用 −ln(1 − u) / rate 反查 CDF。

    【参数】rate：每秒到达的请求数；seed：np.random.default_rng 的种子（只用 .random()）。
    """
    if not rate > 0:
        raise ValueError(f"到达率必须为正（每秒的请求数，收到 {rate}）")
    u = np.random.default_rng(seed).random(n)
    return np.cumsum(-np.log1p(-u) / rate)


def uniform_ints(lo, hi, n, seed):
    """n 个 [lo, hi) 里均匀分布的整数：lo + floor(u · (hi − lo))，u 来自 default_rng(seed).random()。"""
    u = np.random.default_rng(seed).random(n)
    return (lo + np.floor(u * (hi - lo))).astype(np.int64)


# ---------------------------------------------------------------------------
# 模拟 1：静态批 vs 连续批（只看 decode）
# ---------------------------------------------------------------------------
def simulate_batching(model, chip, prompt_len, out_lens, slots, continuous, w_bits=16.0, kv_bits=16.0):
    """
    slots 个位置的 decode 引擎处理一串请求（都在 t = 0 到达、提示已经 prefill 好），返回 dict：
    time（总秒数）、tokens（生成的 token 总数）、steps（迭代次数）、mean_active（平均每步在算的序列数）、
    throughput（tokens / time）、tpot（平均每步时间 = 每个序列的 TPOT，每步算一次）、
    tpot_token（按 token 加权的每步时间：每个生成的 token 记下产出它的那一步的时间，再对所有 token 平均
    = Σ 步时间 × 这步在算的序列数 / tokens）、finish（每个请求最后一个 token 出来的时刻，按请求编号的元组；
    请求都在 t = 0 到达，所以它就是请求的完成时间）。

    【推导】每一步：所有在算的序列各生成一个 token，时间 = iteration_time（上下文 = 提示 + 已生成）。
    continuous=True（连续批）：一个序列生成完，下一步就把队列里的下一个请求放进它的位置。
    continuous=False（静态批）：按顺序 slots 个一组，整组最长的那个生成完才换下一组；
    组里先完成的位置空着（这里假设空位置不计算——对静态批有利的假设）。
    【参数】out_lens：每个请求要生成的 token 数（≥ 1）。
    """
    out_lens = [int(x) for x in out_lens]
    if not out_lens:
        raise ValueError("至少要有一个请求")
    if min(out_lens) < 1 or slots < 1:
        raise ValueError("每个请求至少生成 1 个 token，位置至少 1 个")
    queue = deque(range(len(out_lens)))
    active = {}                                     # 请求编号 -> 已生成的 token 数
    t, tokens, steps, active_sum, token_time = 0.0, 0, 0, 0, 0.0
    finish = [0.0] * len(out_lens)
    while queue or active:
        if continuous or not active:
            while queue and len(active) < slots:
                active[queue.popleft()] = 0
        ctx_sum = sum(prompt_len + g for g in active.values())
        dt = iteration_time(model, chip, len(active), ctx_sum, w_bits=w_bits, kv_bits=kv_bits)
        t += dt
        steps += 1
        active_sum += len(active)
        tokens += len(active)
        token_time += dt * len(active)
        for r in list(active):
            active[r] += 1
            if active[r] == out_lens[r]:
                finish[r] = t
                del active[r]
    return {"time": t, "tokens": tokens, "steps": steps, "mean_active": active_sum / steps,
            "throughput": tokens / t, "tpot": t / steps, "tpot_token": token_time / tokens,
            "finish": tuple(finish)}


# ---------------------------------------------------------------------------
# 模拟 2：prefill / decode 同机 vs 解耦
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
        finished = 0
        while finished < len(mine):
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
    【边界】同 simulate_colocated。
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
    while nxt < len(order) or running:
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


# ---------------------------------------------------------------------------
# ---- goodput 与 SLO ----
# 模拟 2 的精简版（同样的规则、同样的结果，测试逐个请求核对），外加多台 prefill / decode 机器，
# 以及按 DistServe 的定义找 goodput：≥ 90% 的请求同时达到 TTFT 和 TPOT 目标时的最高到达率。
# ---------------------------------------------------------------------------
def _iteration_clock(model, chip, w_bits=16.0, kv_bits=16.0, dtype="bf16"):
    """
    iteration_time 的快速版：模型和芯片的常数先算好，返回两个函数：
    clock(n_decode, decode_context_sum, prefill_tokens, prefill_prefix) → 秒（一次迭代）；
    decode_clock(n_decode, ctx_sums) → 秒的数组（纯 decode 的一串迭代，ctx_sums 是 int64 数组）。
    式子和运算顺序与 iteration_time 一字不差（测试核对逐位相等）；不再检查参数，只给下面的模拟用。
    """
    iteration_time(model, chip, 1, 1, w_bits=w_bits, kv_bits=kv_bits, dtype=dtype)      # 借它检查模型和参数
    attn = 4 * model.n_heads * model.head_dim * model.n_layers
    kv_pos = model.kv_bytes_per_token(kv_bits / 8)
    head = model.vocab * model.d_model
    mm = model.matmul_params()
    w = model.active_params() * w_bits / 8
    peak, bw = chip.peak_flops(dtype), chip.mem_bw

    def clock(n_decode=0, decode_context_sum=0, prefill_tokens=0, prefill_prefix=0):
        c, p = prefill_tokens, prefill_prefix
        pairs = c * p + c * (c + 1) // 2
        flops = (2 * mm * n_decode + (2 * (mm - head) * c + 2 * head if c else 0)
                 + attn * (decode_context_sum + pairs))
        nbytes = w + kv_pos * (decode_context_sum + (p if c else 0))
        return max(flops / peak, nbytes / bw)

    def decode_clock(n_decode, ctx_sums):
        return np.maximum((2 * mm * n_decode + attn * ctx_sums) / peak, (w + kv_pos * ctx_sums) / bw)
    return clock, decode_clock


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
    【边界】同 simulate_colocated（请求不合法、chunk < 1 抛 ValueError）。
    """
    _check_requests(arrivals, prompt_lens, out_lens)
    if chunk is not None and chunk < 1:
        raise ValueError(f"分块至少 1 个 token（收到 chunk={chunk}）")
    n = len(arrivals)
    arr = [float(a) for a in arrivals]
    P, O = [int(x) for x in prompt_lens], [int(x) for x in out_lens]
    first, last, gaps, gap1 = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    b = _DecodeBatch(P, O, first, last)
    clock, decode_clock = _iteration_clock(model, chip)
    nxt, t, finished, done_prefill = 0, 0.0, 0, 0
    waiting = deque()
    while finished < n:
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
    【边界】请求不合法、机器数 < 1 抛 ValueError。
    """
    _check_requests(arrivals, prompt_lens, out_lens)
    if n_prefill < 1 or n_decode < 1:
        raise ValueError(f"prefill 机和 decode 机都至少 1 台（收到 {n_prefill}, {n_decode}）")
    n = len(arrivals)
    P, O = [int(x) for x in prompt_lens], [int(x) for x in out_lens]
    first, last, gaps, gap1 = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    clock, decode_clock = _iteration_clock(model, chip)
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
        while finished < len(mine):
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


def slo_attainment(res, ttft_slo, tpot_slo):
    """
    同时达到两个目标的请求所占的比例：TTFT ≤ ttft_slo 且 TPOT ≤ tpot_slo（秒）。只生成 1 个 token 的请求 TPOT 记 0。

    【边界】目标必须为正，否则抛 ValueError。
    """
    if not (ttft_slo > 0 and tpot_slo > 0):
        raise ValueError(f"TTFT、TPOT 目标都必须为正（秒；收到 {ttft_slo}, {tpot_slo}）")
    ok = (np.asarray(res["ttft"]) <= ttft_slo) & (np.asarray(res["tpot"]) <= tpot_slo)
    return float(ok.mean())


def find_goodput(attainment_at, rates, n_refine=4, goal=0.9, max_rate=math.inf):
    """
    goodput（DistServe 的定义）：SLO 达标率 ≥ goal 的最高到达率。先在粗网格 rates 上二分，找相邻的两个率：
    低的达标、高的不达标；再在这两个率之间均匀插 n_refine 个点，同样二分细找一次。返回 dict：goodput（达标的最高率；
    网格里最低的率都不达标时为 0）、upper（比它高、不达标的最低率；最高的率也达标时为 inf）、
    tested（{率: 达标率}，所有算过的点，按率排好）。

    【推导】二分假设达标率随负载单调下降——这时它和从小到大一个一个试的结果一样，只是试的点少（约 log₂ 个）。
    有限个请求的模拟里达标率有抽样起伏，单调只是近似（同一组随机数跑所有的率，起伏小）。
    真值在 [goodput, upper) 里，细找以后精度 = 粗网格那一格的宽度 / (n_refine + 1)。
    【参数】attainment_at：函数，到达率 → 达标率；rates：递增的正数；max_rate：到达率 ≥ 它时系统长期撑不住
    （某一侧的利用率 ≥ 1，队列越排越长，例如 prefill_capacity 给的上限），不用模拟、直接算不达标——有限个请求的模拟
    看不出这一点：队列还没排长，请求就发完了。
    【边界】rates 空、不递增或有非正数，n_refine < 0，goal 不在 (0, 1] 里，都抛 ValueError。
    """
    rates = [float(r) for r in rates]
    if not rates or not all(r > 0 for r in rates) or any(b <= a for a, b in zip(rates, rates[1:])):
        raise ValueError(f"到达率网格必须是不空、递增的正数（收到 {rates}）")
    if n_refine < 0 or not 0 < goal <= 1:
        raise ValueError(f"n_refine ≥ 0、goal 在 (0, 1] 里（收到 {n_refine}, {goal}）")
    tested = {}

    def last_pass(grid, lo, hi):
        """grid[lo] 达标（或 lo = −1）、grid[hi] 不达标（或 hi = len）：二分到两者相邻，返回 (lo, hi)。"""
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if grid[mid] not in tested:
                tested[grid[mid]] = attainment_at(grid[mid]) if grid[mid] < max_rate else 0.0
            lo, hi = (mid, hi) if tested[grid[mid]] >= goal else (lo, mid)
        return lo, hi

    i, j = last_pass(rates, -1, len(rates))
    if i < 0 or j == len(rates):
        return {"goodput": rates[i] if i >= 0 else 0.0, "upper": rates[j] if j < len(rates) else math.inf,
                "tested": dict(sorted(tested.items()))}
    step = (rates[j] - rates[i]) / (n_refine + 1)
    fine = [rates[i]] + [rates[i] + k * step for k in range(1, n_refine + 1)] + [rates[j]]
    i, j = last_pass(fine, 0, len(fine) - 1)
    return {"goodput": fine[i], "upper": fine[j], "tested": dict(sorted(tested.items()))}


def prefill_capacity(model, chip, prompt_lens):
    """
    一台 prefill 机（一次一个提示）长期最多每秒能 prefill 多少个请求 = 1 / 平均 prefill 时间（这批提示的平均）。

    【推导】排队论：到达率 × 平均服务时间 = 利用率 ρ；ρ ≥ 1 时队列越排越长，TTFT 没有上限。
    n 台 prefill 机的上限是 n 倍；同机部署的 GPU 还要做 decode，它的上限只会更低（这是必要条件，不是充分条件）。
    【边界】提示长度不空、每个 ≥ 1，否则抛 ValueError。
    """
    lens = [int(x) for x in prompt_lens]
    if not lens or min(lens) < 1:
        raise ValueError(f"至少一个提示、每个至少 1 个 token（收到 {len(lens)} 个，最短 {min(lens, default=0)}）")
    clock, _ = _iteration_clock(model, chip)
    return len(lens) / sum(clock(prefill_tokens=n) for n in lens)


def knee_chunk(model, chip, n_decode, decode_context_sum):
    """
    分块 prefill 的拐点：n_decode 个序列（上下文之和 decode_context_sum）的一次 decode 迭代里，能顺带 prefill
    而迭代时间一点不变的最大块（token 数，提示的开头那一块，prefill_prefix = 0）。

    【推导】decode 迭代受带宽限制：时间 = 读的字节 / 带宽。顺带的 c 个提示 token（从头算起）只加 FLOPs、不多读 KV，
    只要总 FLOPs / 峰值还不超过读的时间，iteration_time 就不变（Sarathi-Serve 说的"借 decode 闲着的算力"）。
    iteration_time 对 c 单调不减：先倍增找上界，再二分找最大的 c。
    【边界】n_decode < 1 抛 ValueError；这一步本来就 compute-bound（加 1 个 token 都变慢）时返回 0。
    """
    if n_decode < 1:
        raise ValueError(f"decode 批至少 1 个序列（收到 {n_decode}）")
    base = iteration_time(model, chip, n_decode, decode_context_sum)

    def free(c):
        return iteration_time(model, chip, n_decode, decode_context_sum, prefill_tokens=c) <= base
    lo, hi = 0, 1
    while free(hi):
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if free(mid) else (lo, mid)
    return lo


# ---------------------------------------------------------------------------
# ---- KV 内存的分配 ----
# 同一串请求、同一块 KV 内存，三种分配法：按服务上限预留、按"提示 + 这个请求的最大输出"预留、按块（分页）随用随分；
# 分页时还可以让共同的系统提示共享块（写时复制）。只数 token 位置，不算时间。
# ---------------------------------------------------------------------------
def simulate_kv_allocation(prompt_lens, out_lens, capacity_tokens, policy, reserve=None, block=16,
                           shared_prefix=0, watermark=0.01):
    """
    一块 KV 内存（capacity_tokens 个 token 位置）服务一串请求：全部在 t = 0 排队、先来先服务，每次迭代批里每个请求
    生成一个 token。返回 dict（只统计队列里还有人在等的那些迭代——内存是瓶颈的时候）：
    used_frac（Σ 真 token / Σ 占用的位置）、pool_frac（Σ 真 token / (迭代数 × capacity)）、mean_running、max_running
    （批里的请求数）、mean_tokens（每个在批里的请求平均存着几个 token）、waste_frac（分页：最后一块里空着的位置占占用的
    比例）、mean_waste（分页：平均每个请求最后一块里空着几个位置）、saved_tokens（共享前缀平均省下的位置）、steps、
    preempted（被挤出去重算的次数）。

    【推导】请求 r 在批里待 out[r] 次迭代：第 s 次时存着 P + s − 1 个 token 的 KV（第 1 次是 prefill 写进提示的 P 个；
    第 s ≥ 2 次写进第 s − 1 个生成的 token）。"真 token" = 这些位置。
    policy="reserve"：进来时一次预留 reserve[r] 个位置（标量或每个请求一个数），生成完才放；队首放不下就等（不插队）。
    policy="paged"：block 个位置一块，需要时才分一块（vLLM 的做法）；进来时要能放下提示的块、并且剩下的块不少于
    watermark × 总块数（vLLM 的水位线）；已经在批里的请求要新块而没有时，把最后进来的请求挤出去（放掉它的块、
    回到队首、从头重算——vLLM 的 recompute）。共享前缀（shared_prefix > 0，只在分页时）：所有提示的开头
    shared_prefix 个 token 相同，其中满的块只存一份（有请求在用时存在），最后那个不满的块每个请求复制一份（写时复制）。
    【边界】请求不合法（提示、生成数 < 1，数组不一样长）、预留放不下请求自己（reserve < P + out − 1）或超过容量、
    一个请求自己就装不满内存、共享前缀比某个提示长、未知 policy，都抛 ValueError——而不是一直等下去。
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
    queue = deque(range(n))
    run_r = np.zeros(0, dtype=np.int64)                 # 批里的请求（按进来的先后）
    run_s = np.zeros(0, dtype=np.int64)                 # 它们各自是第几次迭代
    run_h = np.zeros(0, dtype=np.int64)                 # 分页：各自持有的块；预留：各自预留的位置
    free, steps, preempted = total, 0, 0
    sums = {"real": 0, "occupied": 0, "running": 0, "waste": 0, "saved": 0}
    max_running = 0
    while queue or len(run_r):
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
                queue.appendleft(int(run_r[-1]))
                run_r, run_s, run_h, want = run_r[:-1], run_s[:-1], run_h[:-1], want[:-1]
                preempted += 1
            free -= int(want.sum())
            run_h = run_h + want
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
            run_r, run_s, run_h = run_r[~done], run_s[~done], run_h[~done]
            if policy == "paged" and shared_blk and not len(run_r):
                free += shared_blk
        run_s = run_s + 1
    if steps == 0:
        raise ValueError("所有请求一次就都放得下，内存从来不是瓶颈：这个模拟量的是内存放不下时的情形")
    return {"used_frac": sums["real"] / sums["occupied"], "pool_frac": sums["real"] / (steps * total * (
        block if policy == "paged" else 1)), "mean_running": sums["running"] / steps, "max_running": max_running,
            "mean_tokens": (sums["real"] + sums["saved"]) / sums["running"], "waste_frac": sums["waste"] / sums["occupied"],
            "mean_waste": sums["waste"] / sums["running"],
            "saved_tokens": sums["saved"] / steps, "steps": steps, "preempted": preempted}
