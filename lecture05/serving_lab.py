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
import math
from collections import deque

import numpy as np

__all__ = ["iteration_time", "link_time", "step_time", "poisson_arrivals", "uniform_ints",
           "simulate_batching", "simulate_colocated", "simulate_disaggregated"]


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
    【边界】机器空闲时时间跳到下一个到达时刻。请求的数组长度不一、提示或生成数 < 1、n_gpus < 1、chunk < 1 抛 ValueError。
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
