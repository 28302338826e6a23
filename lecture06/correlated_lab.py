"""
correlated_lab —— 成片的难度：难的位置成片出现时式 (1) 为什么高估——"难度成片"的隐状态二元语法模型、
β 的相邻相关（逐位置量的和平稳状态下精确的）、每轮从哪里开始、"假如从这里开始"的期望 token 数（第 6 讲 08 用）。

p = 目标、q = 草稿，同 decode_lab 的约定。
"""
import math

import numpy as np

from decode_lab import NGramLM, acceptance_beta, adjust  # noqa: E402
from transformer_lab import softmax  # noqa: E402（decode_lab 已把 lecture02 放到 sys.path 上）

__all__ = ["regime_models", "lag1_correlation", "bigram_chain_stats", "exact_tokens_per_call", "round_starts",
           "tokens_if_started_at"]


def regime_models(stay, n_words=96, seed=0, spread=1.5, easy_noise=0.1, hard_noise=2.5):
    """
    一对"难度成片出现"的二元语法模型 -> (目标, 草稿)，都是 NGramLM（词表 V = 2 · n_words）。

    【模型】token a = s · n_words + w：s ∈ {0 = 易, 1 = 难} 是"状态"（写在 token 的高位里，所以模型看得见它：
    一个两种状态各用半个词表发射的隐马尔可夫模型，从 token 就读得出状态），w 是"词"。目标：下一个 token 的状态以概率 stay 不变、1 − stay 换成另一个（对称的两状态马尔可夫链），
    词按 f_w 抽（只看上一个词 w，和状态无关）：P(s', w' | s, w) = [stay 或 1 − stay] · f_w(w')。
    草稿：状态的转移和目标完全一样，词换成 g_{s,w}：易状态 g 是 f 加一点噪声（像目标），难状态 g 是 f 加很多噪声。
    【推导】p、q 在两半词表上的形状相同、两半的总质量也相同（stay 和 1 − stay），所以
    β(a) = Σ min(p, q) = stay·(1 − TV(f_w, g_{s,w})) + (1 − stay)·(1 − TV(f_w, g_{s,w})) = 1 − TV(f_w, g_{s,w})，
    和 stay 无关；词的链不看状态，状态的链是对称的，平稳分布 = 状态各一半 × 词的平稳分布 π，也和 stay 无关。
    所以总的 α = ½ Σ_w π(w)(β_易(w) + β_难(w)) 不随 stay 变：stay 只改变"难"的位置是零散的还是成片的
    （平均一段 1 / (1 − stay) 个 token；stay = 0.5 时各位置的状态独立）。
    【参数】f_w = softmax(spread · z)、易 g = softmax(spread · z + easy_noise · z′)、
    难 g = softmax(spread · z + hard_noise · z″)，z、z′、z″ 是 standard_normal（np.random.default_rng(seed)，
    按这个顺序抽），都是**假设**。
    【边界】stay 不在 [0, 1) 里抛 ValueError（stay = 1 时状态永远不变，没有平稳的"一半一半"）。
    """
    if not (isinstance(stay, (int, float, np.floating)) and not isinstance(stay, bool) and 0.0 <= stay < 1.0):
        raise ValueError(f"保持概率 stay 必须在 [0, 1) 里（收到 {stay!r}）；stay = 1 时状态永远不变")
    if not (isinstance(n_words, (int, np.integer)) and not isinstance(n_words, bool) and n_words >= 2):
        raise ValueError(f"n_words 必须是 ≥ 2 的整数（收到 {n_words!r}）")
    rng = np.random.default_rng(seed)
    z = spread * rng.standard_normal((n_words, n_words))                 # [上一个词, 下一个词]
    f = softmax(z)
    g = [softmax(z + easy_noise * rng.standard_normal(z.shape)),         # 易状态的草稿
         softmax(z + hard_noise * rng.standard_normal(z.shape))]         # 难状态的草稿
    move = np.array([[stay, 1.0 - stay], [1.0 - stay, stay]])            # [s, s']
    # 表的行 = (s, w)，列 = (s', w')：P = move[s, s'] · dist[w, w']
    target = np.einsum("ab,wv->awbv", move, f).reshape(2 * n_words, 2 * n_words)
    draft = np.stack([np.einsum("b,wv->wbv", move[s], g[s]) for s in (0, 1)]).reshape(2 * n_words, 2 * n_words)
    with np.errstate(divide="ignore"):
        return (NGramLM(np.log(target), f"隐状态目标（stay = {stay}）"),
                NGramLM(np.log(draft), f"隐状态草稿（stay = {stay}）"))


def lag1_correlation(x):  # [n] 或 [n_seq, n] -> float
    """
    相邻两个位置的相关系数 corr(x_t, x_{t+1})（皮尔逊；二维时每一行是一条序列，只配对同一行里相邻的两个）。

    【边界】少于 2 对、或前一个 / 后一个没有波动（方差为 0）时相关系数没有定义：抛 ValueError。
    """
    x = np.asarray(x, dtype=np.float64)
    x = x[None, :] if x.ndim == 1 else x
    a, b = x[:, :-1].ravel(), x[:, 1:].ravel()
    if a.size < 2:
        raise ValueError(f"至少要 2 对相邻的数才能算相关（收到 {a.size} 对）")
    a, b = a - a.mean(), b - b.mean()
    den = math.sqrt(float((a * a).sum() * (b * b).sum()))
    if den == 0:
        raise ValueError("序列没有波动（方差为 0），相关系数没有定义")
    return float((a * b).sum() / den)


def bigram_chain_stats(target, draft, T=1.0, tol=1e-14, max_steps=1_000_000):
    """
    目标是二元语法表时，平稳状态下的精确值 -> dict：alpha（= E[β]）、beta_pair（= E[β_t β_{t+1}]）、lag1（β 的相邻相关）。

    【推导】目标的转移矩阵 P[a, b] = p(b | a)；平稳分布 π 满足 πP = π。用"懒惰的"链 (I + P) / 2 做幂迭代
    （平稳分布相同，但不会像 stay = 0 那样在两个状态之间来回振荡），直到一步的变化 < tol。
    β(a) = Σ min(p(·|a), q(·|a))（上一个 token 是 a 时草稿被接受的概率）；α = Σ π(a)β(a)；
    E[β_t β_{t+1}] = Σ_a π(a) β(a) Σ_b P[a, b] β(b)；相关 = (E[β_t β_{t+1}] − α²) / Var(β)。
    （只用逐元素的乘加，不调 BLAS / LAPACK：小矩阵在多线程 BLAS 上反而慢，机器忙时尤其如此。）
    【边界】β 处处相等（Var = 0）时 lag1 是 0（没有波动，也就谈不上相关）；max_steps 步还没收敛抛 ValueError。
    """
    P = adjust(target.table, T)
    beta = acceptance_beta(P, adjust(draft.table, T))
    pi = np.full(P.shape[0], 1.0 / P.shape[0])
    for _ in range(max_steps):
        nxt = 0.5 * (pi + (pi[:, None] * P).sum(0))
        if np.abs(nxt - pi).max() < tol:
            break
        pi = nxt
    else:
        raise ValueError(f"平稳分布 {max_steps} 步还没收敛（链几乎不混合：例如状态几乎永远不变）")
    pi = nxt / nxt.sum()
    alpha = float((pi * beta).sum())
    pair = float((pi * beta * (P * beta).sum(1)).sum())
    var = float((pi * (beta - alpha) ** 2).sum())
    return {"alpha": alpha, "beta_pair": pair, "lag1": (pair - alpha ** 2) / var if var > 0 else 0.0}


def _stationary(K, tol, max_steps):  # [V, V] 行随机矩阵 -> [V]
    """πK = π 的平稳分布：懒惰链 (I + K) / 2 的幂迭代（同 bigram_chain_stats 的做法，逐元素乘加）。"""
    pi = np.full(K.shape[0], 1.0 / K.shape[0])
    for _ in range(max_steps):
        nxt = 0.5 * (pi + (pi[:, None] * K).sum(0))
        if np.abs(nxt - pi).max() < tol:
            return nxt / nxt.sum()
        pi = nxt
    raise ValueError(f"平稳分布 {max_steps} 步还没收敛（链几乎不混合：例如状态几乎永远不变）")


def exact_tokens_per_call(target, draft, gamma, T=1.0, tol=1e-15, max_steps=1_000_000):
    """
    目标、草稿都是二元语法表时，固定 γ 的投机解码长期下来每次目标前向产出的 token 数的精确值（不抽样）-> float。

    【推导】一轮从"最后一个确认的 token"x 开始。记 A[a, b] = min(p(b|a), q(b|a))（草稿猜 b 且被接受的概率），
    R[a, b] = max(p(b|a) − q(b|a), 0)（被拒绝、改抽 b 的概率；每行的和 = 1 − β(a)），P = 目标的转移矩阵。
    前 i 个草稿都被接受、停在 b 的概率是 (A^i)[x, b]，所以这一轮的期望 token 数 E[x] = Σ_{i=0..γ} (A^i 1)[x]，
    下一轮的起点的分布 K[x, ·] = Σ_{i<γ} (A^i R)[x, ·] + (A^γ P)[x, ·]（第 i + 1 个被拒绝，或 γ 个全接受再加目标的一个）。
    各轮的起点是一条以 K 为转移矩阵的马尔可夫链；由更新-报酬定理，长期下来每轮（= 每次目标前向）的 token 数
    = Σ_x π_K(x) E[x]，π_K 是 K 的平稳分布。β 处处相等、各位置独立时它就是式 (1)；
    成片的难度让起点更多落在难段里，它就比式 (1) 小（08 脚本演示 1、2）。
    【边界】γ 不是 ≥ 1 的整数抛 ValueError；平稳分布 max_steps 步还没收敛抛 ValueError。
    """
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"γ 必须是 ≥ 1 的整数（收到 {gamma!r}）")
    P, Q = adjust(target.table, T), adjust(draft.table, T)
    A, R = np.minimum(P, Q), np.maximum(P - Q, 0.0)
    reach = np.eye(P.shape[0])                       # A^i：前 i 个都被接受、停在哪个 token
    per_round, K = np.zeros(P.shape[0]), np.zeros_like(P)
    for _ in range(gamma):
        per_round += reach.sum(1)
        K += reach @ R
        reach = reach @ A
    per_round += reach.sum(1)
    K += reach @ P
    return float((_stationary(K, tol, max_steps) * per_round).sum())


def round_starts(n0, accepted):
    """
    每一轮投机解码从序列的哪个位置开始 -> int 数组 [轮数]：第 k 轮要猜的第一个 token 在序列里的下标。

    【推导】第一轮从提示之后（下标 n0）开始；一轮接受 n 个草稿、再加 1 个修正或额外的 token，下一轮从 n + 1 个之后开始。
    """
    return n0 + np.concatenate([[0], np.cumsum(np.asarray(accepted, dtype=np.int64) + 1)[:-1]])


def tokens_if_started_at(betas, starts, gamma):  # [n], [k] -> [k]
    """
    假如一轮从下标 t 开始、第 i 个草稿以 β_{t+i} 被接受（各自独立），这一轮产出的期望 token 数 Σ_{i=0..γ} Π_{j<i} β_{t+j}。

    【推导】式 (1) 的推导换成逐位置的 β：第 i 个草稿被接受要前 i 个都接受。所有 β 都等于 α 时就是 (1 − α^{γ+1}) / (1 − α)。
    用它把"β 相关"拆开看：对所有位置取平均（任意起点）和只对每轮真正开始的位置取平均，差别就是"从哪里开始"的效应。
    【边界】起点之后不足 γ 个 β 的起点抛 ValueError（调用方先去掉序列末尾的起点）。
    """
    betas = np.asarray(betas, dtype=np.float64)
    starts = np.asarray(starts, dtype=np.int64)
    if starts.size and (starts.min() < 0 or starts.max() + gamma > betas.size):
        raise ValueError(f"起点必须在 0..{betas.size - gamma} 之间（后面要有 γ = {gamma} 个 β）")
    out = np.ones(starts.size)
    run = np.ones(starts.size)
    for i in range(gamma):
        run = run * betas[starts + i]
        out += run
    return out
