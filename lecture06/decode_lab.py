"""
decode_lab —— 解码：自回归生成、投机解码（Leviathan et al. 2023 的算法 1 / Chen et al. 2023 的修正拒绝采样），
以及投机解码的期望收益公式。

【p 和 q 的约定】两篇论文的记号相反（Leviathan：p = 目标模型、q = 草稿；Chen：p = 草稿、q = 目标）。
这里按 Leviathan：**p = 目标（target），q = 草稿（draft）**；代码里的数组一律叫 target_probs / draft_probs。

【一步接受 / 拒绝】草稿从 q 抽出 x；以概率 min(1, p(x) / q(x)) 接受（抽 r ~ U[0, 1)，r·q(x) < p(x) 就接受）；
拒绝时从残差分布 norm(max(0, p − q)) 重新抽。输出的分布正好是 p（Leviathan et al. 附录 A.1、Chen et al. 定理 1 的证明；
speculative_step_probs 用精确枚举把它算出来，测试断言等于 p）。残差的和是 0（p == q，舍入后）时用 p 本身。

【模型的接口】TransformerLM（带 KV cache 的 numpy transformer）和 NGramLM（二元语法表）都有 session()：
session.logits(seq, counter) 返回"把 seq 里还没喂的 token 喂进去"得到的那几行 logits；session.truncate(m) 把状态
退回到只看过 seq 的前 m 个 token（KV cache 回滚）。生成器只用这两个操作，所以草稿可以是两种模型中的任何一种。

【随机数】只用 rng.random() 的均匀数，CDF 反查（transformer_lab.sample_inverse_cdf），所以打印的抽样结果不依赖
numpy 版本。投机解码每轮消耗随机数的顺序固定为：γ 个草稿 token 各一个；然后按顺序检查草稿，每检查一个用一个
（第一次拒绝就停）；最后一个用来抽修正 token（拒绝时）或额外的 token（全部接受时）。
"""
import math
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from transformer_lab import NumpyTransformer, sample_inverse_cdf, softmax  # noqa: E402

__all__ = ["TransformerLM", "NGramLM", "adjust", "autoregressive_generate", "speculative_generate",
           "residual_distribution", "speculative_step_probs", "acceptance_beta", "acceptance_rate",
           "expected_tokens", "walltime_speedup", "ops_factor", "best_gamma", "truncated_geometric",
           "alpha_for_speedup", "expected_rounds", "simulate_rounds", "build_seed04_models", "alphas_on_text",
           "chi2_sf", "chi2_gof",
           "multi_draft_verify", "multi_draft_step_probs", "multi_draft_acceptance", "tree_expected_tokens",
           "tree_parents", "tree_speculative_generate"]
__all__ += ["regime_models", "lag1_correlation", "bigram_chain_stats", "round_starts", "tokens_if_started_at",
            "PromptLookup", "induction_token", "CopyingLM", "speculative_generate_adaptive"]


# ---------------------------------------------------------------------------
# 模型
# ---------------------------------------------------------------------------
class _Session:
    """一个模型的增量解码状态：fed = 已经喂进去的 token 数（KV cache 里的位置数）。"""

    def __init__(self, model):
        self.model, self.fed = model, 0
        self.cache = model.new_cache(1) if isinstance(model, NumpyTransformer) else None

    def logits(self, seq, counter=None):  # seq: 整个序列（list） -> [新喂的个数, V]
        """把 seq[fed:] 喂进去，返回这些位置的 logits（最后一行是 seq 之后下一个 token 的 logits）。"""
        new = seq[self.fed:]
        if not new:
            raise ValueError("没有新的 token 可喂：先 truncate 到更短的前缀")
        self.fed = len(seq)
        if self.cache is None:
            return self.model.table[np.asarray(new)]
        return self.model.forward(np.asarray([new]), self.cache, counter)[0]

    def truncate(self, m):
        """退回到只看过前 m 个 token（m ≥ fed 时什么都不做）。"""
        if m < self.fed:
            if self.cache is not None:
                self.cache.rollback(self.fed - m)
            self.fed = m


class TransformerLM(NumpyTransformer):
    """
    带名字的 numpy transformer（见 ../lecture02/transformer_lab）：.params、.cfg、.name；
    full_logits(toks) 一次算完；session() 开一个带 KV cache（可回滚）的增量解码状态。
    """

    def __init__(self, params, cfg, name=""):
        super().__init__(params, cfg)
        self.name = name

    def full_logits(self, toks):  # [n_seq, len] -> [n_seq, len, V]
        """一次前向算出每个位置的下一个 token 的 logits（不用也不改任何会话的缓存）。"""
        return self.forward(np.asarray(toks))

    def session(self):
        return _Session(self)


class NGramLM:
    """
    平滑的二元语法模型：.table[prev] 是下一个 token 的 logits（对数概率），形状 [V, V]；.table[toks] 得到 [..., V]。

    【平滑】加 k 平滑（k = 0.1）：P(b | a) = (count(a, b) + k) / (count(a) + k·V)。
    """

    def __init__(self, table, name="二元语法表"):
        self.table, self.name = table, name

    @classmethod
    def fit(cls, tokens_2d, vocab, k=0.1):
        """从 token 数组 [n_seq, len] 数相邻的 (a, b) 对，加 k 平滑，得到对数概率表。"""
        toks = np.asarray(tokens_2d)
        if k <= 0:
            raise ValueError(f"平滑常数 k 必须为正（收到 {k}）")
        counts = np.zeros((vocab, vocab))
        np.add.at(counts, (toks[:, :-1].ravel(), toks[:, 1:].ravel()), 1.0)
        probs = (counts + k) / (counts.sum(1, keepdims=True) + k * vocab)
        return cls(np.log(probs))

    def session(self):
        return _Session(self)


# ---------------------------------------------------------------------------
# 概率与一步接受 / 拒绝
# ---------------------------------------------------------------------------
def adjust(logits, T):  # [..., V] -> [..., V]
    """
    logits -> 温度 T 下的概率（最后一维）。

    【边界】T = 0 是贪心：argmax 处为 1 的 one-hot（有并列时取下标最小的），不做除以 T 的运算；T < 0 抛 ValueError。
    """
    if not T >= 0:
        raise ValueError(f"温度 T 必须 ≥ 0（T = 0 表示贪心），收到 {T}")
    logits = np.asarray(logits, dtype=np.float64)
    if T == 0:
        out = np.zeros_like(logits)
        np.put_along_axis(out, logits.argmax(-1)[..., None], 1.0, axis=-1)
        return out
    return softmax(logits / T)


def residual_distribution(target_probs, draft_probs):  # [V], [V] -> [V]
    """
    拒绝之后重新抽样用的分布 norm(max(0, p − q))。

    【边界】p == q（舍入后残差全为 0 或和为 0）时返回 p：那时拒绝的概率是 0，返回什么都不影响分布，但不能 0/0。
    """
    r = np.maximum(target_probs - draft_probs, 0.0)
    s = r.sum()
    return r / s if s > 0 else np.asarray(target_probs, dtype=np.float64)


def acceptance_beta(target_probs, draft_probs):  # [..., V], [..., V] -> [...]
    """
    每个位置的 β = Σ_x min(p(x), q(x)) = 1 − TV(p, q)：在这个上下文里一个草稿 token 被接受的概率（Leviathan 定理 3.5）。
    """
    return np.minimum(target_probs, draft_probs).sum(-1)


def acceptance_rate(target_probs, draft_probs):
    """α = 所有位置的 β 的平均（Leviathan 推论 3.6：α = E[Σ min(p, q)]）-> float。"""
    return float(acceptance_beta(target_probs, draft_probs).mean())


def speculative_step_probs(target_probs, draft_probs):  # [V], [V] -> [V]
    """
    一步"草稿抽 x → 接受或拒绝 → 拒绝时从残差重抽"的输出分布，用精确枚举算（不抽样）。

    【推导】对每个草稿 token x：以 q(x)·min(1, p(x)/q(x)) 的概率输出 x；以 q(x)·(1 − min(1, p(x)/q(x))) 的概率
    改从残差分布抽。把所有 x 的贡献加起来。结果应该正好是 p（测试断言）。q(x) = 0 的 x 抽不到，跳过。
    """
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    res = residual_distribution(p, q)
    out = np.zeros_like(p)
    for x in np.flatnonzero(q > 0):
        acc = min(1.0, p[x] / q[x])
        out[x] += q[x] * acc
        out += q[x] * (1.0 - acc) * res
    return out


def _vocab(model):
    return model.cfg.vocab if hasattr(model, "cfg") else model.table.shape[-1]


def _check_generation(prompt, n_new, models, gamma=0):
    """
    检查生成的参数 -> 提示（int 的 list）。

    【边界】n_new < 1、空提示、token 不在 0..V−1、喂进模型的位置超过它的上下文 max_seq 都抛 ValueError。
    模型最多喂进 len(prompt) + n_new − 1 个位置（最后抽出的 token 不用再喂）；投机解码的目标模型还要多 γ 个草稿位置。
    """
    if not (isinstance(n_new, (int, np.integer)) and not isinstance(n_new, bool) and n_new >= 1):
        raise ValueError(f"n_new 必须是 ≥ 1 的整数（收到 {n_new!r}）")
    prompt = [int(t) for t in np.asarray(prompt).ravel()]
    if not prompt:
        raise ValueError("提示至少要有 1 个 token")
    for m in models:
        V = _vocab(m)
        if min(prompt) < 0 or max(prompt) >= V:
            raise ValueError(f"提示里的 token 必须在 0..{V - 1} 之间（收到 {min(prompt)}..{max(prompt)}）")
        cfg = getattr(m, "cfg", None)
        need = len(prompt) + n_new - 1 + gamma
        if cfg is not None and need > cfg.max_seq:
            what = f"提示 {len(prompt)} + 新 token {n_new} − 1" + (f" + 草稿 {gamma}" if gamma else "")
            name = getattr(m, "name", "") or "模型"
            raise ValueError(f"{what} = {need} 个位置，超过 {name} 的上下文 max_seq = {cfg.max_seq}")
    return prompt


# ---------------------------------------------------------------------------
# ---- 成片的难度：隐状态模型与 prompt lookup ----
# （第 6 讲 08 脚本用：难的位置成片出现时式 (1) 为什么高估；自适应 γ；不用模型的草稿 prompt lookup）
# ---------------------------------------------------------------------------
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


class PromptLookup:
    """
    不用模型的草稿（vLLM 的 n-gram / "prompt lookup" 草稿）：拿最后 n 个 token 在前面的上下文里找匹配，
    把匹配后面跟着的 token 当作草稿。草稿是确定的：q 是这个 token 上的 one-hot（接受概率就是 p(x)）。
    （vLLM 从 prompt_lookup_max 到 prompt_lookup_min 试几个 n，几个匹配里用哪一个各版本不同；这里只用一个 n，
    取最近的一次匹配——和 CopyingLM 的归纳规则抄的是同一处。）

    propose(seq, k)：最多 k 个草稿 token 的 list；找不到（或 seq 不到 n + 1 个 token）时是空 list——这一轮不草稿，
    目标模型前向一次、照常抽 1 个 token（退化成普通 decode 的一步）。
    【边界】n < 1、k < 0、空的上下文都抛 ValueError。
    """

    def __init__(self, n=2, name=""):
        if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1):
            raise ValueError(f"n-gram 的长度 n 必须是 ≥ 1 的整数（收到 {n!r}）")
        self.n, self.name = int(n), name or f"prompt lookup（n = {n}）"

    def propose(self, seq, k):
        """最后 n 个 token 上一次（最靠后的一次、不含它自己）出现之后的最多 k 个 token -> list。"""
        if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 0):
            raise ValueError(f"草稿个数 k 必须是 ≥ 0 的整数（收到 {k!r}）")
        seq = [int(t) for t in seq]
        if not seq:
            raise ValueError("上下文是空的：prompt lookup 至少要有 1 个 token 才能去找")
        n, L = self.n, len(seq)
        key = seq[L - n:]
        for i in range(L - n - 1, -1, -1):           # 从后往前找：最近的一次
            if seq[i:i + n] == key:
                return seq[i + n:i + n + k]
        return []


def induction_token(seq, t, n=2):
    """
    "归纳规则"在位置 t 给出的 token：最后 n 个 token seq[t−n:t] 上一次出现时后面跟着的 token -> int 或 None。

    【推导】找最大的 j ≤ t − 2 使 seq[j−n+1 .. j] = seq[t−n .. t−1]，返回 seq[j + 1]；t ≤ n 或找不到时返回 None。
    n = 2 就是"当前二元组上一次出现时的下文"。和 PromptLookup(n).propose(seq[:t], 1) 给的第一个草稿是同一个 token。
    """
    if t <= n:
        return None
    key = list(seq[t - n:t])
    for j in range(t - 2, n - 2, -1):
        if list(seq[j - n + 1:j + 1]) == key:
            return int(seq[j + 1])
    return None


class CopyingLM:
    """
    会"照抄"的目标模型：p = (1 − λ)·p_base + λ·[归纳规则给出的 token 上的 one-hot]（找不到时 p = p_base）。

    【模型的假设】真实的语言模型靠归纳头（induction heads）照抄上下文里出现过的片段；QCFG 这样的随机模型不会抄
    （它对重复段落里"该抄的"token 的概率和别的 token 差不多）。这里的混合是**假设**，代替归纳头：
    以概率 λ 延续最后 n 个 token（n = 2：当前的二元组）上一次出现时的下文（induction_token）。.cfg 和 .name 来自 base（上下文 max_seq 一样）。
    session()：和 TransformerLM 一样的 logits(seq, counter) / truncate(m)；logits 是混合分布的对数。
    【边界】λ 不在 [0, 1] 里抛 ValueError；λ = 0 就是 base。
    """

    def __init__(self, base, lam, n=2, name=""):
        if not (isinstance(lam, (int, float, np.floating)) and not isinstance(lam, bool) and 0.0 <= lam <= 1.0):
            raise ValueError(f"照抄的概率 λ 必须在 [0, 1] 里（收到 {lam!r}）")
        if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1):
            raise ValueError(f"n-gram 的长度 n 必须是 ≥ 1 的整数（收到 {n!r}）")
        self.base, self.lam, self.n = base, float(lam), int(n)
        self.cfg, self.name = base.cfg, name or f"照抄的目标（λ = {lam}）"

    def mix(self, base_logits, toks, first):  # [n, V], 整个序列, 第一行对应的位置 -> [n, V]
        """base 的 logits（第 r 行是位置 first + r 的下一个 token）-> 混合分布的对数。"""
        p = softmax(np.asarray(base_logits, dtype=np.float64))
        for r in range(p.shape[0]):
            x = induction_token(toks, first + r + 1, self.n)
            if x is not None:
                p[r] *= 1.0 - self.lam
                p[r, x] += self.lam
        with np.errstate(divide="ignore"):
            return np.log(p)

    def full_logits(self, toks):  # [n_seq, len] -> [n_seq, len, V]
        toks = np.asarray(toks)
        base = self.base.full_logits(toks)
        return np.stack([self.mix(base[i], list(toks[i]), 0) for i in range(toks.shape[0])])

    def session(self):
        return _CopySession(self)


class _CopySession:
    """CopyingLM 的增量状态：base 的会话（带 KV cache、可回滚）+ 归纳规则（只看 token，不用缓存）。"""

    def __init__(self, model):
        self.model, self.inner = model, model.base.session()

    def logits(self, seq, counter=None):  # -> [新喂的个数, V]
        first = self.inner.fed
        return self.model.mix(self.inner.logits(seq, counter), seq, first)

    def truncate(self, m):
        self.inner.truncate(m)


def speculative_generate_adaptive(target, draft, prompt, n_new, gamma, T, rng, gamma_max=None, counter_t=None):
    """
    草稿长度可变的投机解码 -> (新 token 的 int 数组 [n_new], stats)；每轮的接受 / 拒绝和 speculative_generate 完全一样。

    【草稿】draft 是模型（有 session()）：每轮从它抽 γ_k 个；draft 是 PromptLookup：每轮取它 propose(seq, γ_k) 的
    最多 γ_k 个（q 是 one-hot，不消耗随机数；一个都没有时这一轮只让目标模型前向一次、抽 1 个 token）。
    【γ 怎么变】gamma_max 为 None：γ_k 固定为 gamma（模型草稿时输出和随机数的消耗与 speculative_generate 逐位相同，
    测试断言）。否则按 Hugging Face transformers 的 "heuristic" 规则：这一轮的草稿全部被接受，下一轮 γ + 2
    （不超过 gamma_max）；有拒绝就 γ − 1（不少于 1）；这一轮没有草稿（prompt lookup 找不到）时不变。
    stats：target_calls（轮数）、accepted（每轮接受的个数）、drafted（每轮草稿的个数）。
    【边界】gamma < 1、gamma_max < gamma 抛 ValueError；上下文按 gamma_max（或 gamma）检查。
    """
    g_top = gamma if gamma_max is None else gamma_max
    for name, g in (("gamma", gamma), ("gamma_max", g_top)):
        if not (isinstance(g, (int, np.integer)) and not isinstance(g, bool) and g >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {g!r}）")
    if g_top < gamma:
        raise ValueError(f"gamma_max = {g_top} 不能小于起始的 γ = {gamma}")
    adjust(np.zeros(1), T)
    lookup = isinstance(draft, PromptLookup)
    seq = _check_generation(prompt, n_new, [target] if lookup else [target, draft], g_top)
    n0 = len(seq)
    t_sess = target.session()
    d_sess = None if lookup else draft.session()
    V = _vocab(target)
    calls, accepted, drafted, g = 0, [], [], int(gamma)
    while len(seq) - n0 < n_new:
        # 1. 草稿
        if lookup:
            drafts = draft.propose(seq, g)
            qs = [np.eye(1, V, x)[0] for x in drafts]
        else:
            drafts, qs = [], []
            for _ in range(g):
                q = adjust(d_sess.logits(seq + drafts)[-1], T)
                drafts.append(int(sample_inverse_cdf(q, rng.random())))
                qs.append(q)
        k = len(drafts)
        # 2. 目标模型一次前向：最后 k + 1 行
        ps = adjust(t_sess.logits(seq + drafts, counter_t)[-(k + 1):], T)
        calls += 1
        # 3. 依次接受 / 拒绝
        n = 0
        while n < k:
            x = drafts[n]
            if rng.random() * qs[n][x] < ps[n][x]:
                n += 1
            else:
                break
        # 4. 修正 token 或额外的 token
        dist = residual_distribution(ps[n], qs[n]) if n < k else ps[k]
        seq += drafts[:n] + [int(sample_inverse_cdf(dist, rng.random()))]
        accepted.append(n)
        drafted.append(k)
        # 5. 回滚
        t_sess.truncate(len(seq) - 1)
        if d_sess is not None:
            d_sess.truncate(len(seq) - 1)
        # 6. 下一轮的 γ
        if gamma_max is not None and k > 0:
            g = min(g + 2, gamma_max) if n == k else max(g - 1, 1)
    return (np.asarray(seq[n0:n0 + n_new], dtype=np.int64),
            {"target_calls": calls, "accepted": accepted, "drafted": drafted})


def autoregressive_generate(model, prompt, n_new, T, rng, counter=None):
    """
    普通的自回归生成 -> int 数组 [n_new]（不含提示）。每个新 token 一次前向；第一次前向覆盖整个提示。

    【参数】T：温度（0 = 贪心）；rng：np.random.Generator（每个 token 用一个均匀数）；counter：记目标模型的账。
    """
    adjust(np.zeros(1), T)  # 尽早检查 T
    seq = _check_generation(prompt, n_new, [model])
    n0 = len(seq)
    sess = model.session()
    for _ in range(n_new):
        probs = adjust(sess.logits(seq, counter)[-1], T)
        seq.append(int(sample_inverse_cdf(probs, rng.random())))
    return np.asarray(seq[n0:], dtype=np.int64)


def speculative_generate(target, draft, prompt, n_new, gamma, T, rng, counter_t=None):
    """
    投机解码（Leviathan 算法 1）-> (新 token 的 int 数组 [n_new], stats)。

    stats["target_calls"]：轮数 = 目标模型的前向次数（第一轮的前向连提示一起算，没有单独的预填充）；
    stats["accepted"]：每轮被接受的草稿个数（0..γ）的列表。
    【每一轮】（论文的步骤，下标从 1 开始，代码里从 0 开始）
      1. 草稿模型自回归地抽 γ 个 token x₁..x_γ，记下各自的分布 q₁..q_γ；
      2. 目标模型一次前向算出 p₁..p_{γ+1}（γ + 1 个位置）；
      3. 依次检查 x_i：r_i·q_i(x_i) < p_i(x_i) 就接受，否则在第一个被拒绝的位置停；
      4. 有拒绝（位置 n + 1）：从 norm(max(0, p_{n+1} − q_{n+1})) 抽修正 token；全部接受：从 p_{γ+1} 抽额外的 token；
      5. 两个模型的缓存都回滚到已确定的序列（新抽的那个 token 还没喂过）。
    每轮都草稿 γ 个；最后输出截到 n_new 个。
    【边界】γ < 1 抛 ValueError（γ = 0 就是普通解码，用 autoregressive_generate）；T = 0 时输出正好是目标模型的贪心序列。
    """
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 1 的整数（收到 {gamma!r}）；γ = 0 是普通解码")
    adjust(np.zeros(1), T)
    seq = _check_generation(prompt, n_new, [target, draft], gamma)
    n0 = len(seq)
    t_sess, d_sess = target.session(), draft.session()
    calls, accepted = 0, []
    while len(seq) - n0 < n_new:
        # 1. 草稿 γ 个
        drafts, qs = [], []
        for _ in range(gamma):
            q = adjust(d_sess.logits(seq + drafts)[-1], T)
            drafts.append(int(sample_inverse_cdf(q, rng.random())))
            qs.append(q)
        # 2. 目标模型一次前向：最后 γ + 1 行是 p₁..p_{γ+1}
        ps = adjust(t_sess.logits(seq + drafts, counter_t)[-(gamma + 1):], T)
        calls += 1
        # 3. 依次接受 / 拒绝
        n = 0
        while n < gamma:
            x = drafts[n]
            if rng.random() * qs[n][x] < ps[n][x]:
                n += 1
            else:
                break
        # 4. 修正 token 或额外的 token
        dist = residual_distribution(ps[n], qs[n]) if n < gamma else ps[gamma]
        seq += drafts[:n] + [int(sample_inverse_cdf(dist, rng.random()))]
        accepted.append(n)
        # 5. 回滚：两个模型都只保留已确定的前缀（最后一个新 token 下一轮再喂）
        t_sess.truncate(len(seq) - 1)
        d_sess.truncate(len(seq) - 1)
    return np.asarray(seq[n0:n0 + n_new], dtype=np.int64), {"target_calls": calls, "accepted": accepted}


# ---------------------------------------------------------------------------
# 公式（Leviathan et al. 2023）
# ---------------------------------------------------------------------------
def _check_alpha_gamma(alpha, gamma):
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"接受率 α 必须在 [0, 1] 之间（收到 {alpha}）")
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 0):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 0 的整数（收到 {gamma!r}；γ = 0 是普通解码）")


def expected_tokens(alpha, gamma):
    """
    每轮（每次目标前向）平均产出的 token 数 E = (1 − α^{γ+1}) / (1 − α)（论文式 (1)）。

    【推导】产出 1 + (被接受的个数)；第 i 个草稿被接受的概率是 α^i（前 i 个都接受），E = Σ_{i=0..γ} α^i。
    【边界】α = 1 时取极限 γ + 1；γ = 0 时是 1（普通解码）。
    """
    _check_alpha_gamma(alpha, gamma)
    if alpha == 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_speedup(alpha, gamma, c):
    """
    墙钟加速比 = (1 − α^{γ+1}) / ((1 − α)(γc + 1))（定理 3.8）。c = 草稿一次前向 / 目标一次前向的时间。

    【边界】α = 1 取极限 (γ + 1) / (γc + 1)；γ = 0 时是 1；c < 0 抛 ValueError。
    """
    if not c >= 0:
        raise ValueError(f"代价系数 c 必须 ≥ 0（收到 {c}）")
    return expected_tokens(alpha, gamma) / (gamma * c + 1.0)


def ops_factor(alpha, gamma, c_hat):
    """
    总运算量相对普通解码的倍数 = (1 − α)(γĉ + γ + 1) / (1 − α^{γ+1})（定理 3.11）。ĉ = 草稿 / 目标 每 token 的运算量。

    【推导】每轮目标模型算 γ + 1 个位置、草稿算 γ 个（各 ĉ），产出 E 个 token。
    【边界】α = 1 取极限 (γĉ + γ + 1) / (γ + 1)；γ = 0 时是 1；ĉ < 0 抛 ValueError。
    """
    if not c_hat >= 0:
        raise ValueError(f"运算量系数 ĉ 必须 ≥ 0（收到 {c_hat}）")
    return (gamma * c_hat + gamma + 1.0) / expected_tokens(alpha, gamma)


def best_gamma(alpha, c, max_gamma=256):
    """
    在 γ = 1..max_gamma 里找墙钟加速比最大的 γ -> (γ*, 加速比)。

    【边界】没有任何 γ 的加速比 > 1（α ≤ c 时；α = c 时 γ = 1 正好是 1）返回 (0, 1.0)：不划算，用普通解码；
    c ≤ 0 或 α = 1 时加速比随 γ 无限增长、没有有限的最优值：抛 ValueError；最优值落在 max_gamma 上（真正的最优
    可能更远，例如 α = 0.999、c = 10⁻⁴）也抛 ValueError。
    """
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"接受率 α 必须在 [0, 1] 之间（收到 {alpha}）")
    if not c > 0:
        raise ValueError(f"c = {c}：需要 c > 0（草稿免费时 γ 越大越快，没有有限的最优 γ）")
    if alpha == 1.0:
        raise ValueError("α = 1：草稿永远被接受，γ 越大越快，没有有限的最优 γ（需要 α < 1）")
    best = (0, 1.0)
    for g in range(1, max_gamma + 1):
        s = walltime_speedup(alpha, g, c)
        if s > best[1] * (1 + 1e-12):
            best = (g, s)
    if best[0] == max_gamma:
        raise ValueError(f"α = {alpha}、c = {c} 的最优 γ 超出搜索范围 1..{max_gamma}：调大 max_gamma")
    return best


# ---------------------------------------------------------------------------
# ---- 论文对照 ----
# 第 6 讲 06、07 用：把定理 3.8 倒过来用（从论文报告的加速比求 α）、不跑模型的"独立同分布"模拟、
# 种子 04 的模型和四个草稿、在文本上量 α。
# ---------------------------------------------------------------------------
def alpha_for_speedup(speedup, gamma, c, tol=1e-12):
    """
    反解定理 3.8：加速比为 speedup（草稿长度 γ、代价系数 c）时的接受率 α -> float。

    【推导】speedup(α) = (1 + α + … + α^γ) / (γc + 1) 随 α 严格增加：α = 0 时是 1 / (γc + 1)，
    α = 1 时是 (γ + 1) / (γc + 1)。所以在 [0, 1] 上二分，直到区间短于 tol。
    【边界】speedup 不在 [1 / (γc + 1), (γ + 1) / (γc + 1)] 里（没有这样的 α）抛 ValueError；γ 必须 ≥ 1（γ = 0 时加速比恒为 1，
    求不出 α）；c < 0 抛 ValueError。
    """
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 1 的整数（收到 {gamma!r}；γ = 0 时加速比恒为 1，求不出 α）")
    lo_s, hi_s = walltime_speedup(0.0, gamma, c), walltime_speedup(1.0, gamma, c)
    if not lo_s <= speedup <= hi_s:
        raise ValueError(f"γ = {gamma}、c = {c} 时加速比只能在 {lo_s:.4g}（α = 0）到 {hi_s:.4g}（α = 1）之间，"
                         f"收到 {speedup}")
    lo, hi = 0.0, 1.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if walltime_speedup(mid, gamma, c) < speedup:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def expected_rounds(alpha, gamma, n_new):
    """
    产出 n_new 个 token 平均要几轮（= 目标模型前向几次）-> float。各位置独立、接受率都是 α（式 (1) 的假设）。

    【推导】一轮产出 X = 1 + 被接受的个数 ∈ 1..γ + 1 个 token（截断几何分布）。记 u_k = "有一轮从第 k 个新 token
    开始"的概率：u_0 = 1，u_k = Σ_j u_{k−j}·P(X = j)（更新方程）。轮数 = 从 0..n_new − 1 开始的轮数，
    所以期望 = Σ_{k < n_new} u_k。最后一轮可能越过 n_new（多产出的被截掉），所以 n_new / 期望轮数 < E(α, γ)：
    这就是 "n_new / 轮数" 这个估计偏低的原因；n_new 越大，截掉的那一点占比越小。
    【边界】n_new 必须是 ≥ 1 的整数；γ = 0 时每轮 1 个 token，期望 = n_new。
    """
    _check_alpha_gamma(alpha, gamma)
    if not (isinstance(n_new, (int, np.integer)) and not isinstance(n_new, bool) and n_new >= 1):
        raise ValueError(f"n_new 必须是 ≥ 1 的整数（收到 {n_new!r}）")
    px = truncated_geometric(alpha, gamma)  # px[j − 1] = P(X = j)
    u = np.zeros(n_new)
    u[0] = 1.0
    for k in range(1, n_new):
        j = np.arange(1, min(k, gamma + 1) + 1)
        u[k] = float((u[k - j] * px[j - 1]).sum())
    return float(u.sum())


def simulate_rounds(alpha, gamma, n_new, n_runs, rng):
    """
    不跑模型，模拟 n_runs 次"投机解码生成 n_new 个 token"-> dict（各位置独立、每个草稿以概率 α 被接受）：
      "calls"：[n_runs] 每次的轮数（目标前向次数）；
      "accepted"：[n_runs] 每次所有轮被接受的草稿个数之和（最后一轮整轮计入，不截断）。

    【做法】每轮给每次运行 γ 个均匀数 u：从头数连续 u < α 的个数就是这一轮被接受的个数 n，这一轮产出 n + 1 个 token
    （和 speculative_generate 一样：第一个被拒绝的位置换成修正 token；全部接受时多一个额外的 token）。产够 n_new 的运行停下。
    【随机数】每轮 rng.random((n_runs, γ))，已经停下的运行也照样消耗，所以结果只取决于种子和参数。
    【边界】γ ≥ 1、n_new ≥ 1、n_runs ≥ 1 的整数，否则 ValueError；α = 1 时每轮 γ + 1 个。
    """
    _check_alpha_gamma(alpha, gamma)
    for name, v in (("γ", gamma), ("n_new", n_new), ("n_runs", n_runs)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")
    made = np.zeros(n_runs, dtype=np.int64)
    calls = np.zeros(n_runs, dtype=np.int64)
    accepted = np.zeros(n_runs, dtype=np.int64)
    while True:
        live = made < n_new
        if not live.any():
            break
        ok = rng.random((n_runs, gamma)) < alpha                  # [n_runs, γ]
        n = np.cumprod(ok, axis=1).sum(axis=1)                    # 从头数连续接受的个数
        made += live * (n + 1)
        calls += live
        accepted += live * n
    return {"calls": calls, "accepted": accepted}


def build_seed04_models():
    """
    种子 04（和 03）的目标模型和四个草稿 -> (target, drafts)；drafts = {名字: 模型}，名字、顺序和种子 04 打印的一样。

    【做法】和种子 04 的 build_models 完全相同（同样的种子、同样的量化；测试逐个参数、逐个 α 核对）：目标 = 第 3 讲的
    QCFG 模型（init_params 的种子 0）；草稿 = INT4-g32 量化的自己（lm_head 也量化）、只用前 3 层、只用前 1 层、
    在目标采样的 64 × 128 个 token（种子 1）上拟合的二元语法表。种子脚本不能被导入（文件名以数字开头），
    所以把它放在这里给 06、07 用。需要 ../lecture03 的 quant_lab（它再用 ../prereq3）。
    """
    for sub in ("lecture03", "prereq3"):
        path = os.path.join(_HERE, "..", sub)
        if path not in sys.path:
            sys.path.insert(0, path)
    from quant_lab import QCFG, quantize_params, sample_tokens
    from transformer_lab import config_like, init_params

    P = init_params(QCFG, seed=0)
    target = TransformerLM(P, QCFG, "目标")
    drafts = {"INT4 量化的自己": TransformerLM(quantize_params(P, "int4-g32", include_lm_head=True)[0], QCFG, "int4")}
    for k in (3, 1):
        pk = dict(P)
        pk["layers"] = P["layers"][:k]
        drafts[f"只用前 {k} 层"] = TransformerLM(pk, config_like(QCFG, n_layers=k), f"前{k}层")
    drafts["二元语法表"] = NGramLM.fit(sample_tokens(P, QCFG, n_seq=64, length=128, seed=1), QCFG.vocab)
    return target, drafts


def alphas_on_text(target, drafts, toks, temps=(1.0,)):  # toks: [n_seq, len]
    """
    每个草稿在文本 toks 上的 α（逐位置算 β = Σ min(p, q) 再取平均，推论 3.6）-> {名字: [每个温度一个 α]}。

    【做法】和种子 04 的 measured_alpha 一样；目标模型的 logits 只算一次，每个草稿的也只算一次，每个温度各自 adjust。
    T = 0 时 p、q 都是 one-hot，α = 两个模型的 argmax 相同的位置的比例。
    【参数】drafts：{名字: 草稿模型}（TransformerLM 或 NGramLM）；temps：温度的元组。
    """
    lp = target.full_logits(toks)
    out = {}
    for name, draft in drafts.items():
        lq = draft.table[np.asarray(toks)] if isinstance(draft, NGramLM) else draft.full_logits(toks)
        out[name] = [acceptance_rate(adjust(lp, T), adjust(lq, T)) for T in temps]
    return out


# ---- 论文对照（完）----


def truncated_geometric(alpha, gamma):
    """
    每轮被接受个数的分布（各位置独立、接受率都是 α 时）：P(n) = α^n (1 − α)（n < γ），P(γ) = α^γ -> 长 γ + 1 的数组。
    """
    _check_alpha_gamma(alpha, gamma)
    return np.array([alpha ** n * (1 - alpha) for n in range(gamma)] + [alpha ** gamma])


# ---------------------------------------------------------------------------
# 拟合优度：检查抽样和精确分布一致（只用 numpy 和标准库）
# ---------------------------------------------------------------------------
def chi2_sf(x, dof):
    """
    χ² 分布的右尾概率 P(X ≥ x)，自由度 dof = 正则化上不完全伽马函数 Q(dof/2, x/2)。

    【做法】x < a + 1 时用级数算 P 再取 1 − P，否则用连分式（Lentz 算法）直接算 Q（Numerical Recipes §6.2 的方法）。
    """
    if dof < 1:
        raise ValueError(f"自由度至少为 1（收到 {dof}）")
    if x <= 0:
        return 1.0
    a, z = dof / 2.0, x / 2.0
    log_pre = a * math.log(z) - z - math.lgamma(a)
    if z < a + 1:
        term = total = 1.0 / a
        for n in range(1, 1000):
            term *= z / (a + n)
            total += term
            if term < total * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    tiny = 1e-300
    b = z + 1 - a
    cc, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        cc = b + an / cc
        cc = tiny if abs(cc) < tiny else cc
        d = 1.0 / d
        delta = d * cc
        h *= delta
        if abs(delta - 1) < 1e-16:
            break
    return math.exp(log_pre) * h


def chi2_gof(counts, probs, min_expected=5.0):
    """
    Pearson χ² 拟合优度检验：观测次数 counts 是否来自分布 probs -> (χ², 自由度, p 值)。

    【做法】期望次数 < min_expected 的格子合并成一格（χ² 近似需要每格期望够大）；概率为 0 的格子如果有观测，
    χ² = inf、p = 0。自由度 = 格子数 − 1。
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    if counts.shape != probs.shape or n <= 0 or np.any(counts < 0):
        raise ValueError("counts 和 probs 必须一样长，counts 非负且至少有一次观测")
    if np.any(probs < 0) or abs(probs.sum() - 1.0) > 1e-9:
        raise ValueError(f"probs 必须是一个分布（非负、和为 1；收到和 {probs.sum()}）")
    if np.any((probs <= 0) & (counts > 0)):
        return math.inf, 0, 0.0
    exp = probs * n
    big = exp >= min_expected
    obs_cells = list(counts[big])
    exp_cells = list(exp[big])
    if np.any(~big) and exp[~big].sum() > 0:
        obs_cells.append(counts[~big].sum())
        exp_cells.append(exp[~big].sum())
    o, e = np.array(obs_cells), np.array(exp_cells)
    stat = float(((o - e) ** 2 / e).sum())
    dof = len(o) - 1
    return stat, dof, (chi2_sf(stat, dof) if dof >= 1 else 1.0)


# ---- 树形投机解码 ----
# SpecInfer（Miao et al. 2024，arXiv 2305.09781）的多步投机采样：一个位置上有 k 个候选（从草稿分布 q 独立同分布地抽），
# 依次检查；目标模型一次前向用树形注意力（transformer_lab.tree_mask）给整棵草稿树打分，被接受的路径留在 KV cache 里
# （transformer_lab.KVCache.keep）。p = 目标、q = 草稿，同本文件开头的约定。
from transformer_lab import tree_mask  # noqa: E402
def _check_k(k):
    if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1):
        raise ValueError(f"候选个数 k 必须是 ≥ 1 的整数（收到 {k!r}）")


def multi_draft_verify(target_probs, draft_probs, candidates, rng):
    """
    多候选验证（SpecInfer 的多步投机采样）抽一次 -> (i, token)：i = 被接受的候选的下标（0..k−1），全部拒绝时 i = -1。

    【推导】p₁ = p；依次检查候选 x_i（都从 q 抽）：r·q(x_i) < p_i(x_i) 就接受 x_i（概率 min(1, p_i(x_i)/q(x_i))），
    否则 p_{i+1} = norm(max(0, p_i − q))；k 个都被拒绝时从 p_{k+1} 抽。输出的分布正好是 p（multi_draft_step_probs 精确枚举）。
    k = 1 就是普通的一步规则（speculative_generate 里的那一步）。
    【随机数】每检查一个候选用一个均匀数（接受就停）；全部拒绝时再用一个抽残差。
    【边界】candidates 为空抛 ValueError；p_i == q（舍入后）时残差用 p_i（residual_distribution 的兜底），那时不会拒绝。
    """
    _check_k(len(candidates))
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    for i, x in enumerate(candidates):
        if rng.random() * q[x] < p[x]:
            return i, int(x)
        p = residual_distribution(p, q)
    return -1, int(sample_inverse_cdf(p, rng.random()))


def multi_draft_step_probs(target_probs, draft_probs, k):  # [V], [V] -> [V]
    """
    k 个候选的多候选验证一步的输出分布，用精确枚举算（不抽样）-> [V]。

    【推导】第 i 轮（还没有候选被接受的概率为 s_i，s₁ = 1）：对每个 q(x) > 0 的 x，以 s_i·q(x)·min(1, p_i(x)/q(x)) 输出 x；
    拒绝的概率 s_{i+1} = s_i·Σ_x q(x)(1 − min(1, p_i(x)/q(x)))，p_{i+1} = norm(max(0, p_i − q))；
    k 轮之后剩下的 s_{k+1} 从 p_{k+1} 抽。结果应该正好是 p（测试断言）。k = 1 就是 speculative_step_probs。
    【边界】k < 1 抛 ValueError。
    """
    _check_k(k)
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    out = np.zeros_like(p)
    still = 1.0
    for _ in range(k):
        reject = 0.0
        for x in np.flatnonzero(q > 0):
            acc = min(1.0, p[x] / q[x])
            out[x] += still * q[x] * acc
            reject += q[x] * (1.0 - acc)
        still *= reject
        p = residual_distribution(p, q)
    return out + still * p


def multi_draft_acceptance(target_probs, draft_probs, k):  # [..., V], [..., V] -> [...]
    """
    k 个候选里有一个被接受的概率 = 1 − Π_{i=1..k} (1 − β_i)，β_i = Σ min(p_i, q)，p_i 同 multi_draft_verify -> [...]。

    【推导】第 i 个候选被拒绝的概率是 1 − β_i（Leviathan 定理 3.5 用在 p_i 上），各候选独立地从 q 抽。k = 1 时就是 β。
    对所有位置取平均得到 α_k（k 个候选时每层的接受率；α₁ = α）。
    【边界】k < 1 抛 ValueError；残差的和为 0 时用 p_i（同 residual_distribution）。
    """
    _check_k(k)
    p = np.asarray(target_probs, dtype=np.float64)
    q = np.asarray(draft_probs, dtype=np.float64)
    all_rejected = np.ones(p.shape[:-1])
    for i in range(k):
        all_rejected = all_rejected * (1.0 - acceptance_beta(p, q))
        if i + 1 < k:
            r = np.maximum(p - q, 0.0)
            s = r.sum(-1, keepdims=True)
            p = np.divide(r, s, out=p.copy(), where=s > 0)
    return 1.0 - all_rejected


def tree_expected_tokens(level_alphas):
    """
    树每轮（每次目标前向）平均产出的 token 数 E = 1 + Σ_{d=1..D} Π_{j≤d} a_j，a_j = 第 j 层的接受率 -> float。

    【推导】走到第 d 层的概率是前 d 层都有候选被接受的概率之积（各层独立时）；产出 1 + 走到的深度。
    第 j 层有 k_j 个候选时 a_j = α_{k_j}（multi_draft_acceptance 的平均）。链（每层 1 个，a_j = α）就是式 (1)。
    【边界】空的 level_alphas（没有草稿）是 1；a_j 不在 [0, 1] 里抛 ValueError。
    """
    a = np.asarray(level_alphas, dtype=np.float64)
    if np.any(~((a >= 0) & (a <= 1))):
        raise ValueError(f"每层的接受率必须在 [0, 1] 之间（收到 {list(a)}）")
    return float(1.0 + np.cumprod(a).sum())


def tree_parents(branching):
    """
    按层分叉的草稿树 -> 每个节点的父节点（list，-1 = 接在已确定的序列后面），节点按层、同层按父节点的顺序排。

    【参数】branching[d] = 第 d + 1 层每个节点有几个孩子，例如 (3, 2, 1, 1)：深 4 层，3 + 6 + 6 + 6 = 21 个节点。
    【边界】空的 branching、不是正整数的分叉数抛 ValueError。
    """
    if isinstance(branching, (str, bytes)) or not hasattr(branching, "__len__") or len(branching) == 0:
        raise ValueError(f"branching 必须是非空的正整数元组，例如 (3, 2, 1, 1)（收到 {branching!r}）")
    for b in branching:
        if not (isinstance(b, (int, np.integer)) and not isinstance(b, bool) and b >= 1):
            raise ValueError(f"branching 的每一层必须是 ≥ 1 的整数（收到 {tuple(branching)!r}）")
    parents, prev = [], [-1]
    for b in branching:
        level = []
        for a in prev:
            for _ in range(b):
                level.append(len(parents))
                parents.append(a)
        prev = level
    return parents


def tree_speculative_generate(target, draft, prompt, n_new, branching, T, rng, counter_t=None):
    """
    树形投机解码 -> (新 token 的 int 数组 [n_new], stats)，约定同 speculative_generate：
    stats["target_calls"] = 轮数 = 目标模型的前向次数；stats["accepted"] = 每轮被接受的深度（0..len(branching)）的列表。

    【每一轮】
      1. 草稿按层长一棵树（tree_parents(branching)）：第 d 层的每个节点从它父节点的草稿分布 q 独立地抽 branching[d] 个孩子；
         草稿每层前向一次（树形注意力：每个节点只看已确定的序列和自己的祖先），最后一层（叶子）不用再算；
      2. 目标模型一次前向给整棵树打分（还没喂的已确定 token + 所有节点），得到每个节点的 p；
      3. 从根往下：一个节点的孩子们用多候选规则（multi_draft_verify）验证；接受了就走到那个孩子，
         全部拒绝就从残差抽修正 token、结束；走到叶子就从叶子的 p 抽额外的 token；
      4. 两个模型的缓存都只留下被接受的路径（KVCache.keep），和从头喂这条路径一样。
    【随机数】每轮：每个节点一个（按节点顺序抽草稿）；验证时每检查一个候选一个；最后一个抽修正 / 额外的 token。
    branching 全是 1（一条链）时和 speculative_generate 用随机数的顺序完全一样。
    【边界】目标模型必须是 TransformerLM（要树形注意力）；branching 不合规矩（见 tree_parents）、提示 + 新 token − 1 + 树的
    节点数超过上下文都抛 ValueError。T = 0 时草稿的候选全一样（q 是 one-hot），输出正好是目标模型的贪心序列。
    """
    parents = tree_parents(branching)
    if not isinstance(target, NumpyTransformer):
        raise ValueError("树形投机解码的目标模型必须是 TransformerLM（要用树形注意力一次给整棵树打分）")
    adjust(np.zeros(1), T)
    N, D = len(parents), len(branching)
    seq = _check_generation(prompt, n_new, [target, draft], N)
    n0 = len(seq)
    starts, size = [0], 1                            # 第 d + 1 层的节点是 starts[d]..starts[d + 1] − 1
    for b in branching:
        size *= b
        starts.append(starts[-1] + size)
    children = [[] for _ in range(N + 1)]            # children[a + 1] = 节点 a 的孩子（a = -1 是根）
    for i, a in enumerate(parents):
        children[a + 1].append(i)
    t_sess, d_sess = target.session(), draft.session()
    calls, accepted = 0, []
    while len(seq) - n0 < n_new:
        L = len(seq)
        # 1. 草稿按层长树：qs[a + 1] = 节点 a 的孩子们的草稿分布
        qs = [adjust(d_sess.logits(seq)[-1], T)] + [None] * N
        toks = []
        mask, pos = tree_mask(parents, L)
        for d in range(D):
            for i in range(starts[d], starts[d + 1]):
                toks.append(int(sample_inverse_cdf(qs[parents[i] + 1], rng.random())))
            if d + 1 < D:
                lv = slice(starts[d], starts[d + 1])
                rows = _tree_rows(d_sess, toks[lv], mask[lv, :L + starts[d + 1]], pos[lv])
                qs[starts[d] + 1:starts[d + 1] + 1] = list(adjust(rows, T))
        # 2. 目标模型一次前向：还没喂的已确定 token（一条链）+ 整棵树
        pend = seq[t_sess.fed:]
        par = list(range(-1, len(pend) - 1)) + [len(pend) - 1 if a < 0 else len(pend) + a for a in parents]
        t_mask, t_pos = tree_mask(par, t_sess.fed)
        ps = adjust(_tree_rows(t_sess, pend + toks, t_mask, t_pos, counter_t)[len(pend) - 1:], T)
        calls += 1
        # 3. 从根往下验证
        a, path = -1, []
        while True:
            kids = children[a + 1]
            if not kids:                             # 叶子：额外的 token
                tok = int(sample_inverse_cdf(ps[a + 1], rng.random()))
                break
            i, tok = multi_draft_verify(ps[a + 1], qs[a + 1], [toks[c] for c in kids], rng)
            if i < 0:
                break
            a = kids[i]
            path.append(a)
        seq += [toks[c] for c in path] + [tok]
        accepted.append(len(path))
        # 4. 缓存只留下被接受的路径（草稿没喂过叶子）
        _keep_path(t_sess, L, path)
        _keep_path(d_sess, L, [c for c in path if c < starts[D - 1]])
    return np.asarray(seq[n0:n0 + n_new], dtype=np.int64), {"target_calls": calls, "accepted": accepted}


def _tree_rows(sess, toks, mask, pos, counter=None):  # -> [len(toks), V]
    """把 toks 按遮罩 mask、RoPE 位置 pos 喂进会话的缓存 -> 每个 token 一行 logits（二元语法表只看 token 自己）。"""
    if sess.cache is None:
        sess.fed += len(toks)
        return sess.model.table[np.asarray(toks)]
    out = sess.model.forward(np.asarray([toks]), sess.cache, counter, mask, pos)[0]
    sess.fed += len(toks)
    return out


def _keep_path(sess, start, path):
    """会话的缓存在 start 以后只留下 path 这几个节点（按顺序挪到一起）；fed 跟着变。"""
    if sess.cache is not None:
        sess.cache.keep(start, path)
    sess.fed = start + len(path)
