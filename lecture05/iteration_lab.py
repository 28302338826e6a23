"""
iteration_lab —— 服务引擎一次迭代（decode 一批 + 一段 prefill）的 roofline 时间、它的快速版和分块 prefill 的拐点，
以及跨机器搬数据的时间和种子 05 的一步时间。
多卡合成（gang）在 ../lecture01/hw_specs；权重字节、显存装得下的批、compute-bound 的批和临界上下文在 ../lecture01/llm_math。

【约定】
- 时间都是 **roofline 下界**（llm_math.decode_step / prefill_time 的口径）：max(FLOPs / 峰值算力, 字节 / 带宽)，
  没有固定开销、没有通信；需要开销的地方（第 5 讲 04、种子 05 的玩具模型）用 step_time 显式加上。
- n 块卡合成一块（gang）是**理想张量并行**的假设：带宽、容量、算力都乘 n，卡间通信不要钱。
- iteration_time 只接受稠密、没有滑动窗口的模型（Llama 这一族）：它把一批序列的上下文加起来算 KV 字节和
  注意力 FLOPs，这只在每层都看全部位置时成立。

【出处】硬件数字见 ../lecture01/hw_specs（互联表在它的末尾）；模型结构见 ../lecture01/llm_math。
"""
import numpy as np

__all__ = ["iteration_time", "iteration_clock", "knee_chunk", "link_time", "step_time"]

# knee_chunk 最多倍增到这么多 token（2⁴⁰ ≈ 1.1 万亿，比任何提示都长）：
# iteration_time 坏了、不再随块变大时报错，而不是一直倍增
_KNEE_LIMIT = 2 ** 40


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



def iteration_clock(model, chip, w_bits=16.0, kv_bits=16.0, dtype="bf16"):
    """
    iteration_time 的快速版：模型和芯片的常数先算好，返回两个函数：
    clock(n_decode, decode_context_sum, prefill_tokens, prefill_prefix) → 秒（一次迭代）；
    decode_clock(n_decode, ctx_sums) → 秒的数组（纯 decode 的一串迭代，ctx_sums 是 int64 数组）。
    式子和运算顺序与 iteration_time 一字不差（测试核对逐位相等）；不再检查参数，
    只给第 5 讲的模拟用（disagg_lab、goodput_lab）。
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


def knee_chunk(model, chip, n_decode, decode_context_sum):
    """
    分块 prefill 的拐点：n_decode 个序列（上下文之和 decode_context_sum）的一次 decode 迭代里，能顺带 prefill
    而迭代时间一点不变的最大块（token 数，提示的开头那一块，prefill_prefix = 0）。

    【推导】decode 迭代受带宽限制：时间 = 读的字节 / 带宽。顺带的 c 个提示 token（从头算起）只加 FLOPs、不多读 KV，
    只要总 FLOPs / 峰值还不超过读的时间，iteration_time 就不变（Sarathi-Serve 说的"借 decode 闲着的算力"）。
    iteration_time 对 c 单调不减：先倍增找上界，再二分找最大的 c。
    【边界】n_decode < 1 抛 ValueError；这一步本来就 compute-bound（加 1 个 token 都变慢）时返回 0。
    倍增到 2⁴⁰ 个 token 迭代时间还没变（FLOPs 至少随 c 线性长，不会发生，除非 iteration_time 坏了）抛 RuntimeError，
    而不是一直倍增下去。
    """
    if n_decode < 1:
        raise ValueError(f"decode 批至少 1 个序列（收到 {n_decode}）")
    base = iteration_time(model, chip, n_decode, decode_context_sum)

    def free(c):
        return iteration_time(model, chip, n_decode, decode_context_sum, prefill_tokens=c) <= base
    lo, hi = 0, 1
    while free(hi):
        if hi >= _KNEE_LIMIT:
            raise RuntimeError(f"knee_chunk：顺带 prefill {hi:,} 个 token 迭代时间还没变——iteration_time 不随块变大，"
                               "倍增停不下来（这是代码的错，不是参数的错）")
        lo, hi = hi, 2 * hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if free(mid) else (lo, mid)
    return lo


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
