"""
flash_lab —— 分块注意力（FlashAttention 的在线 softmax）和普通写法的结果与 HBM 流量（第 2 讲 05 用）。
"""
import math

import numpy as np

from transformer_lab import softmax  # noqa: E402

__all__ = ["flash_attention", "naive_attention", "flash_blocks", "attention_io", "online_softmax"]


def _check_attention(q, k, v, causal):
    """检查注意力的输入形状：q [H, n_q, d]，k、v [H_kv, n_k, d]，H 是 H_kv 的整数倍；因果时 n_q ≤ n_k。"""
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    if q.ndim != 3 or k.ndim != 3 or v.shape != k.shape:
        raise ValueError(f"形状应为 q [H, n_q, d]、k 和 v [H_kv, n_k, d]（收到 q {q.shape}、k {k.shape}、v {v.shape}）")
    H, n_q, d = q.shape
    H_kv, n_k, d_k = k.shape
    if d != d_k or min(H, H_kv, n_q, n_k, d) < 1 or H % H_kv:
        raise ValueError(f"q 的头数 {H} 必须是 K/V 头数 {H_kv} 的整数倍、head_dim 相同且各维为正"
                         f"（收到 q {q.shape}、k {k.shape}）")
    if causal and n_q > n_k:
        raise ValueError(f"因果注意力里 query 是最后 n_q 个位置：n_q = {n_q} 不能超过 n_k = {n_k}")
    return q, k, v


def flash_attention(q, k, v, block_q, block_k, causal=True):  # [H, n_q, d], [H_kv, n_k, d] x2 -> [H, n_q, d]
    """
    分块注意力（FlashAttention 的算法，FlashAttention-2 的循环顺序）-> (out, io)。

    【推导】softmax(q·kᵀ/√d + 遮罩)·v 不写出整个 n_q × n_k 的分数矩阵：query 按 block_q 行一块放进片上内存，
    key/value 按 block_k 行一块流过；每来一块 key，算这一块的分数 s，更新每行的"到目前为止的最大值" m 和
    "指数和" l（在线 softmax）：m' = max(m, rowmax(s))，l' = e^{m−m'}·l + Σ e^{s−m'}，
    输出累加器 acc' = e^{m−m'}·acc + e^{s−m'}·v；所有块走完，out = acc / l。（Dao et al. 2022, arXiv 2205.14135，
    算法 1；FlashAttention-2, arXiv 2307.08691 把 query 块放在外层循环。）结果和普通写法只差浮点舍入。
    【io】数在 HBM 和片上块之间搬了多少个**元素**（乘每个元素的字节数才是字节）：每个 query 头单独走一遍
    它的 K/V 头（GQA：组里的头各读一遍）；每个 query 块读一次（block_q × d）、输出写一次；每个 key/value 块
    对每个 query 块各读一次（2 × block_k × d）；因果时整块都在对角线上方的 key 块跳过、不计。
    m、l 留在片上（只做推理，不为反向传播写 logsumexp）。返回 {"read": …, "written": …}。
    【参数】q [H, n_q, d]，k、v [H_kv, n_k, d]；causal=True 时 query 是 n_k 个位置里的最后 n_q 个
    （第 i 个 query 的位置是 n_k − n_q + i，能看 0..它自己）。
    【边界】长度不必是块大小的整数倍（最后一块短一些）；block_q、block_k < 1 抛 ValueError。
    """
    q, k, v = _check_attention(q, k, v, causal)
    if not (int(block_q) == block_q >= 1 and int(block_k) == block_k >= 1):
        raise ValueError(f"块大小必须是正整数（收到 block_q={block_q}, block_k={block_k}）")
    H, n_q, d = q.shape
    H_kv, n_k, _ = k.shape
    group = H // H_kv
    scale = 1.0 / math.sqrt(d)
    out = np.empty_like(q)
    read = written = 0
    offset = n_k - n_q                                   # 因果时 query i 的绝对位置 = offset + i
    for h in range(H):
        kh, vh = k[h // group], v[h // group]
        for q0 in range(0, n_q, block_q):
            q1 = min(q0 + block_q, n_q)
            qb = q[h, q0:q1] * scale                      # 读一个 query 块 [bq, d]
            read += qb.size
            m = np.full(q1 - q0, -np.inf)
            l = np.zeros(q1 - q0)
            acc = np.zeros((q1 - q0, d))
            last = offset + q1 - 1 if causal else n_k - 1  # 这块 query 能看到的最后一个 key
            for k0 in range(0, last + 1, block_k):
                k1 = min(k0 + block_k, n_k)
                kb, vb = kh[k0:k1], vh[k0:k1]             # 读一个 key 块和一个 value 块 [bk, d]
                read += kb.size + vb.size
                s = qb @ kb.T                             # [bq, bk]，只在片上
                if causal:
                    pos_q = offset + np.arange(q0, q1)[:, None]
                    s = np.where(np.arange(k0, k1)[None, :] <= pos_q, s, -np.inf)
                m_new = np.maximum(m, s.max(axis=1))
                alpha = np.exp(m - m_new)                 # 旧的累加按新的最大值缩小
                p = np.exp(s - m_new[:, None])
                l = alpha * l + p.sum(axis=1)
                acc = alpha[:, None] * acc + p @ vb
                m = m_new
            out[h, q0:q1] = acc / l[:, None]              # 写一个输出块
            written += (q1 - q0) * d
    return out, {"read": read, "written": written}


def naive_attention(q, k, v, causal=True):  # [H, n_q, d], [H_kv, n_k, d] x2 -> [H, n_q, d]
    """
    不分块的注意力，三个 kernel（打分、softmax、乘 V）之间经过 HBM -> (out, io)，io 的口径同 flash_attention。

    【io】每个 query 头：打分 kernel 读 q（n_q·d）和 k（n_k·d）、写分数 S（n_q·n_k，遮罩挡住的也写：矩阵是整块的）；
    softmax kernel 读 S、写概率 P（各 n_q·n_k）；第三个 kernel 读 P 和 v（n_k·d）、写输出（n_q·d）。
    合计 读 = n_q·d + 2·n_k·d + 2·n_q·n_k，写 = 2·n_q·n_k + n_q·d。
    """
    q, k, v = _check_attention(q, k, v, causal)
    H, n_q, d = q.shape
    H_kv, n_k, _ = k.shape
    group = H // H_kv
    out = np.empty_like(q)
    read = written = 0
    for h in range(H):
        S = (q[h] / math.sqrt(d)) @ k[h // group].T        # kernel 1：写 S [n_q, n_k]
        read += q[h].size + k[h // group].size
        written += S.size
        if causal:
            S = np.where(np.arange(n_k)[None, :] <= (n_k - n_q + np.arange(n_q))[:, None], S, -np.inf)
        P = softmax(S, axis=-1)                            # kernel 2：读 S、写 P
        read += S.size
        written += P.size
        out[h] = P @ v[h // group]                         # kernel 3：读 P 和 V、写输出
        read += P.size + v[h // group].size
        written += out[h].size
    return out, {"read": read, "written": written}


def flash_blocks(M, d):
    """
    FlashAttention 按片上内存大小选块：片上能放 M 个元素时 B_c = ⌈M / 4d⌉（key 块行数），B_r = min(B_c, d)（query 块行数）
    -> (B_r, B_c)。（Dao et al. 2022 算法 1 第 1 行。）【边界】M < d 或 d < 1 抛 ValueError（放不下一行）。
    """
    if d < 1 or M < d:
        raise ValueError(f"片上内存 M = {M} 个元素至少要放下一行（d = {d}）")
    bc = -(-M // (4 * d))
    return min(bc, d), bc




def attention_io(kind, H, H_kv, n_q, n_k, d, block_q=None, block_k=None, causal=True):
    """
    不运行、只按公式数 naive_attention / flash_attention 搬的元素 -> {"read": …, "written": …}（和真实运行的计数
    逐个相等，测试核对）。大尺寸（32k 的提示）只能这样数。

    【推导】naive：每个 query 头 读 n_q·d + 2·n_k·d + 2·n_q·n_k，写 2·n_q·n_k + n_q·d。
    flash：每个 query 头、每个 query 块 [q0, q1)：读这块 (q1 − q0)·d；它能看到的最后一个 key 是 last
    （因果：n_k − n_q + q1 − 1；否则 n_k − 1），要读的 key 块有 ⌊last / block_k⌋ + 1 个，共 min(块数 × block_k, n_k) 行，
    K 和 V 各读这么多行 × d；写 (q1 − q0)·d。
    【边界】kind 只能是 "naive" 或 "flash"；flash 需要 block_q、block_k。
    """
    if kind == "naive":
        per = {"read": n_q * d + 2 * n_k * d + 2 * n_q * n_k, "written": 2 * n_q * n_k + n_q * d}
        return {key: H * val for key, val in per.items()}
    if kind != "flash":
        raise ValueError(f"未知的注意力写法 {kind!r}；可用：naive、flash")
    if not (block_q and block_k and block_q >= 1 and block_k >= 1):
        raise ValueError(f"flash 需要正的块大小（收到 block_q={block_q}, block_k={block_k}）")
    if causal and n_q > n_k:
        raise ValueError(f"因果注意力里 n_q = {n_q} 不能超过 n_k = {n_k}")
    read = 0
    for q0 in range(0, n_q, block_q):
        q1 = min(q0 + block_q, n_q)
        last = n_k - n_q + q1 - 1 if causal else n_k - 1
        rows = min((last // block_k + 1) * block_k, n_k)
        read += (q1 - q0) * d + 2 * rows * d
    return {"read": H * read, "written": H * n_q * d}


def online_softmax(scores, block):  # [n] -> [(块最大值, m, l), ...]
    """
    一行分数按 block 个一块地流过时，在线 softmax 的两个累计量 -> 每块之后的 (这块的最大值, m, l) 列表。

    【推导】m = 到目前为止的最大值，l = Σ e^{s − m}（到目前为止的分数）。来一块新分数 s_b：
    m' = max(m, max s_b)，l' = e^{m − m'}·l + Σ e^{s_b − m'}——旧的和按新的最大值缩小一次就对了，不用回头重算。
    走完所有块，l·e^{m} = Σ e^{s}，softmax = e^{s − m} / l（flash_attention 的每一行就是这样算的）。
    """
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim != 1 or s.size == 0 or not (int(block) == block >= 1):
        raise ValueError(f"scores 必须是非空的一维数组、block 是正整数（收到形状 {s.shape}、block={block}）")
    m, l, out = -np.inf, 0.0, []
    for i in range(0, s.size, block):
        b = s[i:i + block]
        m_new = max(m, float(b.max()))
        l = math.exp(m - m_new) * l + float(np.exp(b - m_new).sum())
        m = m_new
        out.append((float(b.max()), m, l))
    return out


