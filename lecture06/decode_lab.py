"""
decode_lab —— 解码的模型与采样器：带 KV cache 的语言模型、自回归生成、投机解码（Leviathan et al. 2023 的算法 1 /
Chen et al. 2023 的修正拒绝采样）。

【p 和 q 的约定】两篇论文的记号相反（Leviathan：p = 目标模型、q = 草稿；Chen：p = 草稿、q = 目标）。
这里按 Leviathan：**p = 目标（target），q = 草稿（draft）**；代码里的数组一律叫 target_probs / draft_probs。
第 6 讲的其他实验模块沿用这个约定。

【一步接受 / 拒绝】草稿从 q 抽出 x；以概率 min(1, p(x) / q(x)) 接受（抽 r ~ U[0, 1)，r·q(x) < p(x) 就接受）；
拒绝时从残差分布 norm(max(0, p − q)) 重新抽。输出的分布正好是 p（Leviathan et al. 附录 A.1、Chen et al. 定理 1 的证明；
speculative_step_probs 用精确枚举把它算出来，测试断言等于 p）。残差的和是 0（p == q，舍入后）时用 p 本身。
一整条草稿链的验证只有一处：verify_chain。

【模型的接口】TransformerLM（带 KV cache 的 numpy transformer）和 NGramLM（二元语法表）都有 session()：
session.logits(seq, counter) 返回"把 seq 里还没喂的 token 喂进去"得到的那几行 logits；session.truncate(m) 把状态
退回到只看过 seq 的前 m 个 token（KV cache 回滚）。生成器只用这两个操作，所以草稿可以是两种模型中的任何一种。

【随机数】只用 rng.random() 的均匀数，CDF 反查（transformer_lab.sample_inverse_cdf），所以打印的抽样结果不依赖
numpy 版本。投机解码每轮消耗随机数的顺序固定为：γ 个草稿 token 各一个；然后按顺序检查草稿，每检查一个用一个
（第一次拒绝就停）；最后一个用来抽修正 token（拒绝时）或额外的 token（全部接受时）。

【同一讲的其他实验模块】spec_math_lab（期望收益的公式、论文对照；expected_tokens 等四个公式从这里再导出，
种子 04 从本模块导入它们）、stats_lab（χ² 检验）、correlated_lab（成片的难度）、lookup_lab（prompt lookup、
会照抄的目标、自适应 γ）、tree_lab（树形投机解码）、drafts_lab（种子 04 的目标和草稿：要量化，所以不在这里）。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02"):  # 种子 04 依赖这一点：它只加了 lecture03、prereq3，却导入 console 和 transformer_lab
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from transformer_lab import NumpyTransformer, sample_inverse_cdf, softmax  # noqa: E402
from spec_math_lab import best_gamma, expected_tokens, ops_factor, walltime_speedup  # noqa: E402,F401（种子 04 从这里导入）

__all__ = ["TransformerLM", "NGramLM", "adjust", "autoregressive_generate", "speculative_generate", "verify_chain",
           "sample_from_prompts",
           "residual_distribution", "speculative_step_probs", "acceptance_beta", "acceptance_rate", "alphas_on_text",
           "expected_tokens", "walltime_speedup", "ops_factor", "best_gamma"]


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

    def tree_logits(self, toks, mask, pos, counter=None):  # -> [len(toks), V]
        """把 toks 按遮罩 mask、RoPE 位置 pos 喂进缓存（树形注意力，见 transformer_lab.tree_mask）-> 每个 token 一行 logits。
        二元语法表只看 token 自己，不用遮罩。"""
        if self.cache is None:
            self.fed += len(toks)
            return self.model.table[np.asarray(toks)]
        out = self.model.forward(np.asarray([toks]), self.cache, counter, mask, pos)[0]
        self.fed += len(toks)
        return out

    def keep(self, start, path):
        """缓存在 start 以后只留下 path 这几个位置（按顺序挪到一起，KVCache.keep）；fed 跟着变。"""
        if self.cache is not None:
            self.cache.keep(start, path)
        self.fed = start + len(path)


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
def _check_filters(top_p, top_k, min_p):
    """检查三个过滤器的参数（adjust 和引擎的 add_request 共用）。【边界】范围外或类型不对：ValueError。"""
    if not (isinstance(top_p, (int, float, np.integer, np.floating)) and not isinstance(top_p, bool)
            and 0.0 < top_p <= 1.0):
        raise ValueError(f"top_p 必须在 (0, 1] 里（1 = 不过滤），收到 {top_p!r} / top_p must be in (0, 1]")
    if not (isinstance(top_k, (int, np.integer)) and not isinstance(top_k, bool) and top_k >= -1):
        raise ValueError(f"top_k 必须是 ≥ −1 的整数（−1 或 0 = 不过滤），收到 {top_k!r} / "
                         "top_k must be an integer >= -1 (-1 or 0 = off)")
    if not (isinstance(min_p, (int, float, np.integer, np.floating)) and not isinstance(min_p, bool)
            and 0.0 <= min_p <= 1.0):
        raise ValueError(f"min_p 必须在 [0, 1] 里（0 = 不过滤），收到 {min_p!r} / min_p must be in [0, 1]")


def adjust(logits, T, *, top_p=1.0, top_k=0, min_p=0.0):  # [..., V] -> [..., V]
    """
    logits -> 温度 T 下、经过 min_p、top-k、top-p 过滤的概率（最后一维）。引擎（runner_lab、spec_engine_lab）、
    decode_lab 的生成器和服务器都只用这一个函数抽样。

    【顺序】vLLM V1 的顺序（vllm-project/vllm 的 vllm/v1/sample/sampler.py @3e34265 的 Sampler.sample：先除温度，
    再"不改变 argmax 的 logits processor"——默认就是 min_p，logits_processor/builtin.py @bf17660 的 MinPLogitsProcessor，
    最后 ops/topk_topp_sampler.py @01fa3fe 的 apply_top_k_top_p：先 top-k 后 top-p）：
      1. z = logits / T，p = softmax(z)；
      2. min_p：留下 p ≥ min_p · max p 的 token（等于阈值的留下，同 vLLM 的 probs < 阈值才去掉）；
      3. top-k：在留下的里取 z 最大的 k 个；**和第 k 个值并列的全部留下**（vLLM 去掉的是"< 第 k 个值"的，
         所以留下的可能多于 k 个；这个规则和排序怎么排并列无关，结果是确定的）；
      4. top-p：把留下的重新归一化，按概率从大到小排（**并列时 id 小的排前面**，和 logprobs 的排序一样），一个 token
         前面所有 token 的概率和 < top_p 就留下（最大的那个总会留下）。这就是 vLLM 的"从小到大累加、累加和 ≤ 1 − top_p
         的去掉"换个方向说；vLLM 用 torch.sort，并列的先后没有保证，这里定下来：id 小的先留。
      最后在留下的 token 上重新 softmax（去掉的概率是 0）。
    【参数】top_p ∈ (0, 1]（1 = 关）；top_k：≥ −1 的整数（−1 或 0 = 关，vLLM 的约定）；min_p ∈ [0, 1]（0 = 关）。
    三个都在默认值时走原来的路（softmax(logits / T)），打印的每个字节都不变。
    【边界】T = 0 是贪心：argmax 处为 1 的 one-hot（有并列时取下标最小的），不做除以 T 的运算；三个过滤器都不改变
    argmax（最大的那个总会留下），所以 T = 0 时它们不起作用（参数照样检查）。T < 0、过滤器的参数出界：ValueError。
    投机解码时它们只作用在 p（目标的分布）上，q 是草稿自己抽样用的分布（decode_lab.speculative_generate、spec_engine_lab）。
    """
    if not T >= 0:
        raise ValueError(f"温度 T 必须 ≥ 0（T = 0 表示贪心），收到 {T}")
    _check_filters(top_p, top_k, min_p)
    logits = np.asarray(logits, dtype=np.float64)
    if T == 0:
        out = np.zeros_like(logits)
        np.put_along_axis(out, logits.argmax(-1)[..., None], 1.0, axis=-1)
        return out
    z = logits / T
    if top_p >= 1.0 and top_k in (0, -1) and min_p <= 0.0:
        return softmax(z)
    keep = np.ones(z.shape, dtype=bool)
    if min_p > 0.0:                                                      # 2. min_p
        p = softmax(z)
        keep &= p >= min_p * p.max(-1, keepdims=True)
    if 0 < top_k < z.shape[-1]:                                          # 3. top-k：和第 k 个值并列的都留下
        zk = np.where(keep, z, -np.inf)
        kth = -np.sort(-zk, axis=-1)[..., top_k - 1:top_k]
        keep &= zk >= kth
    if top_p < 1.0:                                                      # 4. top-p：前面的概率和 < top_p 的留下
        p = softmax(np.where(keep, z, -np.inf))
        order = np.argsort(-p, axis=-1, kind="stable")                   # 从大到小，并列时 id 小的在前
        ps = np.take_along_axis(p, order, axis=-1)
        before = np.concatenate([np.zeros_like(ps[..., :1]), np.cumsum(ps, axis=-1)[..., :-1]], axis=-1)
        np.put_along_axis(keep, order, np.take_along_axis(keep, order, axis=-1) & (before < top_p), axis=-1)
    return softmax(np.where(keep, z, -np.inf))


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


def verify_chain(target_probs, draft_probs, drafts, rng):  # [k + 1, V], k × [V], k 个 token -> (n, token)
    """
    验证一条草稿链（Leviathan 算法 1 的第 3、4 步）-> (n, token)：n = 被接受的草稿个数（0..k），
    token = 接在被接受的 n 个之后的那个 token（拒绝时的修正 token，全部接受时的额外 token）。

    【推导】依次检查 x_i（i = 1..k，代码里从 0 开始）：抽 r_i ~ U[0, 1)，r_i·q_i(x_i) < p_i(x_i) 就接受
    （概率 min(1, p_i(x_i) / q_i(x_i))），否则在第一个被拒绝的位置 n 停；有拒绝时从 norm(max(0, p_n − q_n)) 抽修正 token，
    全部接受时从 p_{k+1} 抽额外的 token。输出的分布正好是 p（speculative_step_probs 精确枚举一步）。
    【参数】target_probs：k + 1 行，第 i 行是 p_i（最后一行用于额外的 token）；draft_probs：k 个 q_i；
    drafts：k 个草稿 token（必须是从 draft_probs 抽出来的）。k = 0 时直接从 p₁ 抽（普通 decode 的一步）。
    【随机数】每检查一个草稿用一个 rng.random()（第一次拒绝就停），最后再用一个抽修正 / 额外的 token。
    speculative_generate 和 lookup_lab.speculative_generate_adaptive 都调用这一个函数。
    """
    k = len(drafts)
    n = 0
    while n < k:
        x = drafts[n]
        if rng.random() * draft_probs[n][x] < target_probs[n][x]:
            n += 1
        else:
            break
    dist = residual_distribution(target_probs[n], draft_probs[n]) if n < k else target_probs[k]
    return n, int(sample_inverse_cdf(dist, rng.random()))


# ---------------------------------------------------------------------------
# 生成的参数：停止 token、提示、上下文
# ---------------------------------------------------------------------------
def _stop_set(stop):
    """停止 token 的集合（None = 不停）。【边界】不是整数的 id 抛 ValueError。"""
    if stop is None:
        return frozenset()
    ids = [stop] if isinstance(stop, (int, np.integer)) else list(stop)
    for t in ids:
        if not (isinstance(t, (int, np.integer)) and not isinstance(t, bool) and t >= 0):
            raise ValueError(f"停止 token 必须是 ≥ 0 的整数 id（收到 {t!r}）")
    return frozenset(int(t) for t in ids)


def _finish(seq, n0, n_new, stop):
    """新 token（seq[n0:]）截到 n_new 个、并截到第一个停止 token（含它）-> int 数组。"""
    new = seq[n0:n0 + n_new]
    for i, t in enumerate(new):
        if t in stop:
            return np.asarray(new[:i + 1], dtype=np.int64)
    return np.asarray(new, dtype=np.int64)


def _stopped(seq, start, stop):
    """seq[start:] 里有停止 token 吗（一轮新加的 token 里）。"""
    return bool(stop) and any(t in stop for t in seq[start:])


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
# 生成
# ---------------------------------------------------------------------------
def autoregressive_generate(model, prompt, n_new, T, rng, counter=None, stop=None, *, top_p=1.0, top_k=0, min_p=0.0):
    """
    普通的自回归生成 -> int 数组 [n_new]（不含提示）。每个新 token 一次前向；第一次前向覆盖整个提示。

    【参数】T：温度（0 = 贪心）；rng：np.random.Generator（每个 token 用一个均匀数）；counter：记目标模型的账；
    stop：停止 token 的 id（一个或几个；默认 None = 不停，种子的调用不变）；top_p、top_k、min_p：adjust 的过滤器
    （默认关）。
    【停止】抽到停止 token 就结束：它是返回的最后一个 token（所以输出可能短于 n_new）；之后不再前向。
    """
    filters = {"top_p": top_p, "top_k": top_k, "min_p": min_p}
    adjust(np.zeros(1), T, **filters)  # 尽早检查 T 和过滤器
    stop = _stop_set(stop)
    seq = _check_generation(prompt, n_new, [model])
    n0 = len(seq)
    sess = model.session()
    for _ in range(n_new):
        probs = adjust(sess.logits(seq, counter)[-1], T, **filters)
        seq.append(int(sample_inverse_cdf(probs, rng.random())))
        if seq[-1] in stop:
            break
    return np.asarray(seq[n0:], dtype=np.int64)


def sample_from_prompts(model, prompts, n_per_prompt, n_new, T, rng, stop=None, *, top_p=1.0, top_k=0, min_p=0.0):
    """
    从给定的提示成批地生成（模型自己的"文本"）-> list：每个提示 n_per_prompt 条，每条是新 token 的 int 数组。

    【做法】同一个提示的 n_per_prompt 条序列放在一批里：提示只喂一次（批 1），缓存复制成 n_per_prompt 条（KVCache.repeat），
    然后每步一次 [n, 1] 的前向。
    每步每条序列一个 rng.random()（按序列的顺序），CDF 反查；停下的序列照样消耗随机数、照样前向（结果丢掉），
    所以一条序列抽到什么只取决于种子和它的位置。第 3、6 讲用它在真实模型上取"模型自己的文本"
    （第 3 讲的 sample_tokens 从一个均匀随机的 token 开始，对真实词表不合适）。
    【参数】model：TransformerLM（或任何 NumpyTransformer）；prompts：token id 的 list 的 list；
    stop：停止 token（每条序列截到第一个停止 token，含它）；T = 0 是贪心（同一个提示的各条相同）；
    top_p、top_k、min_p：adjust 的过滤器（默认关）。
    【边界】n_per_prompt、n_new < 1，空提示、越界的 token、提示 + n_new − 1 超过上下文：ValueError。
    """
    filters = {"top_p": top_p, "top_k": top_k, "min_p": min_p}
    adjust(np.zeros(1), T, **filters)
    stop = _stop_set(stop)
    if not (isinstance(n_per_prompt, (int, np.integer)) and not isinstance(n_per_prompt, bool) and n_per_prompt >= 1):
        raise ValueError(f"n_per_prompt 必须是 ≥ 1 的整数（收到 {n_per_prompt!r}）")
    out = []
    for prompt in prompts:
        seq = _check_generation(prompt, n_new, [model])
        one = model.new_cache(1, len(seq) + n_new - 1)
        first = model.forward(np.asarray(seq)[None, :], one)[:, -1]                       # [1, V]：提示只喂一次
        cache = one.repeat(n_per_prompt)
        logits = np.repeat(first, n_per_prompt, axis=0)                                   # [n, V]
        toks = np.zeros((n_per_prompt, n_new), dtype=np.int64)
        for t in range(n_new):
            toks[:, t] = sample_inverse_cdf(adjust(logits, T, **filters), rng.random(n_per_prompt))
            if t + 1 < n_new:
                logits = model.forward(toks[:, t:t + 1], cache)[:, -1]
        out += [_finish(list(row), 0, n_new, stop) for row in toks]
    return out


def speculative_generate(target, draft, prompt, n_new, gamma, T, rng, counter_t=None, stop=None, *, top_p=1.0,
                         top_k=0, min_p=0.0):
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
    【停止】stop（停止 token 的 id，默认 None = 不停）：一轮留下的 token（被接受的草稿 + 修正 / 额外的 token）里出现停止
    token，就在它之后截断（它是输出的最后一个 token）并结束，不再开新的一轮；stats 记的是实际跑过的轮：
    target_calls 不变，accepted 是验证规则在每轮接受的个数（最后一轮停止 token 之后被接受、又被截掉的草稿也算在内，
    和"截到 n_new"时一样）。T = 0 时输出正好是带同样停止 token 的贪心序列（测试断言）。
    【过滤器】top_p、top_k、min_p（adjust 的，默认关）只作用在 p 上：输出的分布是用户要的、过滤过的目标分布；
    q 是草稿真正抽样用的分布（温度 T，不过滤），接受率和残差用的就是它（Leviathan 的证明只要求草稿从 q 抽）。
    【边界】γ < 1 抛 ValueError（γ = 0 就是普通解码，用 autoregressive_generate）；T = 0 时输出正好是目标模型的贪心序列。
    """
    if not (isinstance(gamma, (int, np.integer)) and not isinstance(gamma, bool) and gamma >= 1):
        raise ValueError(f"草稿长度 γ 必须是 ≥ 1 的整数（收到 {gamma!r}）；γ = 0 是普通解码")
    filters = {"top_p": top_p, "top_k": top_k, "min_p": min_p}
    adjust(np.zeros(1), T, **filters)
    stop = _stop_set(stop)
    seq = _check_generation(prompt, n_new, [target, draft], gamma)
    n0 = len(seq)
    t_sess, d_sess = target.session(), draft.session()
    calls, accepted = 0, []
    while len(seq) - n0 < n_new and not _stopped(seq, n0, stop):
        # 1. 草稿 γ 个
        drafts, qs = [], []
        for _ in range(gamma):
            q = adjust(d_sess.logits(seq + drafts)[-1], T)
            drafts.append(int(sample_inverse_cdf(q, rng.random())))
            qs.append(q)
        # 2. 目标模型一次前向：最后 γ + 1 行是 p₁..p_{γ+1}
        ps = adjust(t_sess.logits(seq + drafts, counter_t)[-(gamma + 1):], T, **filters)
        calls += 1
        # 3–4. 依次接受 / 拒绝，然后修正 token 或额外的 token
        n, tok = verify_chain(ps, qs, drafts, rng)
        seq += drafts[:n] + [tok]
        accepted.append(n)
        # 5. 回滚：两个模型都只保留已确定的前缀（最后一个新 token 下一轮再喂）
        t_sess.truncate(len(seq) - 1)
        d_sess.truncate(len(seq) - 1)
    return _finish(seq, n0, n_new, stop), {"target_calls": calls, "accepted": accepted}


# ---------------------------------------------------------------------------
# 在文本上量 α
# ---------------------------------------------------------------------------
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
