"""
distinct_lab —— 一个位置上 k 个**不同**候选的验证规则：精确的两种（无放回、点质量）和有损的两种（Medusa、argmax）。

p = 目标、q = 草稿，同 decode_lab 的约定。tree_lab 的多候选规则要候选从 q 独立、有放回地抽；真实系统的树里同一个
父节点下的候选互不相同：
- 无放回地从 q 抽 k 个（递归拒绝采样，Jeon et al. 2024，"Recursive Speculative Decoding"，arXiv 2402.14160）：
  拒绝 x_i 之后 p 换成残差 norm(max(0, p_i − q_i))，q 去掉 x_i 再归一化；
- 草稿的前 k 名（确定的候选，EAGLE / EAGLE-2 那样）：点质量规则——把候选当成 q = δ_x，以 p(x) 接受，拒绝就令
  p(x) = 0、归一化，再试下一个（EAGLE 的代码 eagle/model/utils.py 的 evaluate_posterior，T > 0 的分支：qx = 1.0，
  拒绝后 gtp[xi] = 0、归一化；仓库 SafeAILab/EAGLE，commit cb7e084）。
两种都精确：输出的分布就是 p（*_step_probs 精确枚举，测试断言）。
有损的两种（输出不是 p，lossy_step_probs 算出它、测试对照手算）：
- Medusa 的典型接受（Cai et al. 2024，arXiv 2401.10774，§2.3.1）：候选 x 的 p(x) > min(ε, δ·exp(−H(p))) 就接受；
  代码的默认值 ε = posterior_threshold = 0.09、δ = posterior_alpha = 0.3（FasterDecoding/Medusa，commit e2a5d20，
  medusa/model/medusa_model.py 的 medusa_generate）；几个候选都过线时取 p 最大的（evaluate_posterior 按似然挑）；
  一个都不过线时输出目标的 argmax（medusa_generate 默认 fast=True：medusa/model/utils.py 的 generate_candidates
  对目标的 logits 取 argmax，它就是接在被接受的前缀后面的 token）。代码在 log 里加 1e-5 算熵，这里按 H(p) = −Σ p ln p。
- "候选是目标的 argmax 就接受"（T > 0 时也这样验证）：argmax 在候选里就输出 argmax，否则从 p 抽。
"""
import numpy as np

from decode_lab import residual_distribution  # noqa: E402
from transformer_lab import sample_inverse_cdf  # noqa: E402

__all__ = ["distinct_draft_verify", "distinct_draft_step_probs", "distinct_draft_acceptance",
           "distinct_rejection_products", "topk_candidates", "topk_draft_verify", "topk_draft_step_probs",
           "topk_acceptance", "MEDUSA_EPSILON", "MEDUSA_DELTA", "typical_threshold", "lossy_step_probs",
           "lossy_verify", "lossy_acceptance", "total_variation", "mean_ci"]

MEDUSA_EPSILON = 0.09     # Medusa 代码 medusa_generate 的 posterior_threshold 默认值（ε）
MEDUSA_DELTA = 0.3        # 同上，posterior_alpha（δ）；代码注释："recommended to be sqrt(posterior_threshold)"
LOSSY_RULES = ("typical", "argmax")


def _probs(x, name):
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or np.any(a < 0) or abs(a.sum() - 1.0) > 1e-9:
        raise ValueError(f"{name} 必须是一维的概率分布（非负、和为 1）")
    return a


def _check_candidates(candidates, V, support=None):
    c = [int(x) for x in candidates]
    if not c:
        raise ValueError("候选不能为空（至少 1 个）")
    if len(set(c)) != len(c) or min(c) < 0 or max(c) >= V:
        raise ValueError(f"候选必须互不相同、在 0..{V - 1} 之间（收到 {c}）")
    if support is not None and np.any(support[c] <= 0):
        raise ValueError(f"候选必须是草稿能抽到的 token（q > 0；收到 {c}）")
    return c


def _check_k(k):
    if not (isinstance(k, (int, np.integer)) and not isinstance(k, bool) and k >= 1):
        raise ValueError(f"候选个数 k 必须是 ≥ 1 的整数（收到 {k!r}）")


def _without(q, x):
    """q 去掉 x 再归一化；去掉之后没有质量了返回 None（q 的支撑用完：候选数被截在支撑的大小）。"""
    q = q.copy()
    q[x] = 0.0
    s = q.sum()
    return q / s if s > 0 else None


# ---------------------------------------------------------------------------
# 无放回地抽的候选：递归拒绝采样（RSD）
# ---------------------------------------------------------------------------
def distinct_draft_verify(target_probs, draft_probs, candidates, rng):
    """
    无放回地从 q 抽出的 k 个候选，递归拒绝采样验证一次 -> (i, token)：i = 被接受的候选（0..k−1），全部拒绝时 i = -1。

    【推导】（Jeon et al. 2024，arXiv 2402.14160 的递归拒绝采样）p₁ = p、q₁ = q；第 i 个候选 x_i 以
    min(1, p_i(x_i)/q_i(x_i)) 接受；拒绝时 p_{i+1} = norm(max(0, p_i − q_i))，q_{i+1} = q_i 去掉 x_i 再归一化
    （无放回地抽，下一个候选正是从 q_{i+1} 抽的）；k 个都拒绝就从 p_{k+1} 抽。x_i 被拒绝说明 p_i(x_i) < q_i(x_i)，
    所以 p_{i+1}(x_i) = 0：残差里不会再出现被拒绝的 token。输出的分布是 p（distinct_draft_step_probs）。
    【随机数】每检查一个候选一个 rng.random()（接受就停）；全部拒绝时再一个抽残差。
    【边界】候选为空、有重复、q = 0 的候选：ValueError；p_i == q_i 时残差用 p_i（residual_distribution 的兜底）。
    """
    p = _probs(target_probs, "target_probs")
    q = _probs(draft_probs, "draft_probs")
    c = _check_candidates(candidates, q.size, q)
    for i, x in enumerate(c):
        if rng.random() * q[x] < p[x]:
            return i, x
        p = residual_distribution(p, q)
        if i + 1 < len(c):
            q = _without(q, x)
    return -1, int(sample_inverse_cdf(p, rng.random()))


def _distinct_enum(p, q, k):
    """(输出的分布, 全部拒绝的概率)：k 个无放回的候选，对所有候选序列精确求和（O(V^k)）。"""
    out, reject = np.zeros_like(p), 0.0
    res = residual_distribution(p, q)
    for x in np.flatnonzero(q > 0):
        acc = min(1.0, p[x] / q[x])
        out[x] += q[x] * acc
        if acc < 1.0:
            rest = _without(q, x) if k > 1 else None
            if rest is None:                 # 第 k 个（或 q 的支撑用完）：从残差抽
                out += q[x] * (1.0 - acc) * res
                reject += q[x] * (1.0 - acc)
            else:
                sub, sub_reject = _distinct_enum(res, rest, k - 1)
                out += q[x] * (1.0 - acc) * sub
                reject += q[x] * (1.0 - acc) * sub_reject
    return out, reject


def distinct_draft_step_probs(target_probs, draft_probs, k):  # [V], [V] -> [V]
    """
    k 个无放回的候选、递归拒绝采样一步的输出分布，精确枚举（不抽样）-> [V]；应该正好等于 p（测试断言）。

    【推导】对第一个候选 x（概率 q(x)）：以 min(p(x), q(x)) 输出 x；否则以 q(x) − p(x) 的概率转到
    (p' = norm(max(0, p − q)), q' = q 去掉 x 再归一化, k − 1) 的同一个问题；k = 1 时拒绝就从 p' 抽。
    【边界】k < 1：ValueError。k 大于 q 的支撑大小 s 时，抽完 s 个不同的 token 就没有候选了：相当于 k = s（截在支撑）。
    枚举的代价是 O(V^k)：只在小词表上用；大词表上的接受率用 distinct_rejection_products 抽样。
    """
    _check_k(k)
    p, q = _probs(target_probs, "target_probs"), _probs(draft_probs, "draft_probs")
    return _distinct_enum(p, q, k)[0]


def distinct_draft_acceptance(target_probs, draft_probs, k):
    """k 个无放回的候选里有一个被接受的概率（精确枚举，O(V^k)）-> float。【边界】同 distinct_draft_step_probs。"""
    _check_k(k)
    p, q = _probs(target_probs, "target_probs"), _probs(draft_probs, "draft_probs")
    return 1.0 - _distinct_enum(p, q, k)[1]


def distinct_rejection_products(target_probs, draft_probs, k_max, n_draws, rng):  # [V], [V] -> [n_draws, k_max]
    """
    抽 n_draws 组无放回的候选（每组 k_max 个），每组的"前 k 个全被拒绝"的条件概率 -> [n_draws, k_max]。

    【推导】候选在验证之前就抽好了；给定候选 x₁..x_k，全被拒绝的概率是 Π_{i≤k} (1 − min(1, p_i(x_i)/q_i(x_i)))
    （p_i、q_i 同 distinct_draft_verify）。把接受用的均匀数积分掉（只抽候选），所以
    α_k = 1 − E[第 k 列]，方差比直接数接受的次数小。一组候选同时给出 k = 1..k_max 的值。
    【随机数】每组每个候选一个 rng.random()（按候选、再按组的顺序：rng.random(n_draws) 一次抽一层）。
    【边界】q 的支撑用完（不同的 token 不够 k_max 个）之后的列不再变（候选数截在支撑的大小）。
    """
    _check_k(k_max)
    _check_k(n_draws)
    p0, q0 = _probs(target_probs, "target_probs"), _probs(draft_probs, "draft_probs")
    n = n_draws
    p, q = np.tile(p0, (n, 1)), np.tile(q0, (n, 1))
    rows = np.arange(n)
    alive = np.ones(n, dtype=bool)                  # 还有候选可抽
    prod, out = np.ones(n), np.zeros((n, k_max))
    for i in range(k_max):
        x = sample_inverse_cdf(q, rng.random(n))
        px, qx = p[rows, x], q[rows, x]
        rej = np.where(alive, 1.0 - np.minimum(1.0, px / np.where(qx > 0, qx, 1.0)), 1.0)
        prod = prod * rej
        out[:, i] = prod
        if i + 1 < k_max:
            r = np.maximum(p - q, 0.0)
            s = r.sum(1, keepdims=True)
            p = np.where(alive[:, None] & (s > 0), r / np.where(s > 0, s, 1.0), p)
            q[rows, x] = np.where(alive, 0.0, q[rows, x])
            sq = q.sum(1, keepdims=True)
            alive = alive & (sq[:, 0] > 0)
            q = np.where(sq > 0, q / np.where(sq > 0, sq, 1.0), q0)
    return out


# ---------------------------------------------------------------------------
# 草稿的前 k 名：点质量规则（EAGLE）
# ---------------------------------------------------------------------------
def topk_candidates(draft_probs, k):  # [..., V] -> [..., k]
    """草稿的前 k 名（概率从大到小；并列时下标小的在前，同 decode_lab.adjust 的 argmax）-> int 数组。"""
    _check_k(k)
    q = np.asarray(draft_probs, dtype=np.float64)
    V = q.shape[-1]
    if k >= V:
        return np.argsort(-q, axis=-1, kind="stable")
    rows = q.reshape(-1, V)
    out = np.empty((rows.shape[0], k), dtype=np.int64)
    for i, row in enumerate(rows):                  # argpartition 找出前 k 名的门槛，和门槛并列的都拿来按下标排
        cut = row[np.argpartition(-row, k - 1)[:k]].min()
        cand = np.flatnonzero(row >= cut)
        out[i] = cand[np.argsort(-row[cand], kind="stable")][:k]
    return out.reshape(q.shape[:-1] + (k,))


def topk_draft_verify(target_probs, candidates, rng):
    """
    确定的候选（草稿的前 k 名）的点质量规则验证一次 -> (i, token)，约定同 distinct_draft_verify。

    【推导】把候选 c 当成从 q = δ_c 抽出来的：接受的概率 min(1, p(c)/1) = p(c)；拒绝时残差
    norm(max(0, p − δ_c)) 就是"p(c) = 0 再归一化"。依次试完 k 个都拒绝，就从剩下的 p 抽。
    这就是先以 p(c₁) 决定是不是 c₁、不是就在其余的里按 p 的比例继续——输出的分布是 p（topk_draft_step_probs）。
    T = 0（p one-hot）：接受 ⇔ 候选是 argmax，全部拒绝就取 argmax：就是贪心。
    【随机数】每检查一个候选一个 rng.random()（接受就停）；全部拒绝时再一个。
    【边界】候选为空或有重复：ValueError；p 在候选之外没有质量时（剩下的全是 0），最后一个候选的接受概率是 1，不会走到兜底。
    """
    p = _probs(target_probs, "target_probs").copy()
    c = _check_candidates(candidates, p.size)
    for i, x in enumerate(c):
        if rng.random() * p.sum() < p[x]:
            return i, x
        p[x] = 0.0
    return -1, int(sample_inverse_cdf(p, rng.random()))


def topk_draft_step_probs(target_probs, candidates):  # [V] -> [V]
    """
    点质量规则一步的输出分布（精确：按"第几个候选被接受"求和）-> [V]；应该正好等于 p（测试断言）。

    【推导】s₁ = 1；第 i 个候选以 s_i·p_i(c_i) 输出，s_{i+1} = s_i·(1 − p_i(c_i))，p_{i+1} = p_i 去掉 c_i 再归一化；
    最后 s_{k+1}·p_{k+1}。
    """
    p = _probs(target_probs, "target_probs").copy()
    c = _check_candidates(candidates, p.size)
    out, still = np.zeros_like(p), 1.0
    for x in c:
        s = p.sum()
        if s <= 0:
            break
        out[x] += still * p[x] / s
        still *= 1.0 - p[x] / s
        p[x] = 0.0
    s = p.sum()
    return out + (still * p / s if s > 0 else 0.0)


def topk_acceptance(target_probs, draft_probs, k):  # [..., V], [..., V] -> [...]
    """
    点质量规则下草稿的前 k 名里有一个被接受的概率 = p(前 k 名) = Σ_{c ∈ 前 k 名} p(c) -> [...]（精确，不抽样）。

    【推导】规则等于"按 p 抽一个 token、看它在不在候选里"（topk_draft_verify 的推导），所以接受的概率就是候选在 p 下的
    总质量。k = 1 时是 p(草稿的 argmax)，不是 Σ min(p, q)：确定的候选丢掉了草稿分布里 argmax 之外的部分。
    """
    top = topk_candidates(draft_probs, k)
    return np.take_along_axis(np.asarray(target_probs, dtype=np.float64), top, axis=-1).sum(-1)


# ---------------------------------------------------------------------------
# 有损的规则
# ---------------------------------------------------------------------------
def typical_threshold(target_probs, epsilon=MEDUSA_EPSILON, delta=MEDUSA_DELTA):  # [..., V] -> [...]
    """Medusa 典型接受的门槛 min(ε, δ·exp(−H(p)))，H(p) = −Σ p ln p（0·ln 0 = 0）-> [...]。"""
    p = np.asarray(target_probs, dtype=np.float64)
    H = -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0), axis=-1)
    return np.minimum(epsilon, delta * np.exp(-H))


def _rule(rule):
    if rule not in LOSSY_RULES:
        raise ValueError(f"有损的规则只有 {LOSSY_RULES}（收到 {rule!r}）")


def lossy_step_probs(rule, target_probs, candidates, epsilon=MEDUSA_EPSILON, delta=MEDUSA_DELTA):  # [V] -> [V]
    """
    有损规则一步的输出分布（精确）-> [V]。

    【规则】"typical"（Medusa）：过线的候选 A = {c : p(c) > min(ε, δ·e^{−H(p)})}；A 非空就输出其中 p 最大的
    （并列取排在前面的候选），否则输出 p 的 argmax——两种情形都是一个确定的 token：输出是点质量，T > 0 的随机性没了。
    "argmax"：p 的 argmax（并列取下标小的）在候选里就输出它（点质量），否则从 p 抽（输出 p）。
    【边界】rule 不是这两个、候选为空或重复：ValueError。
    """
    _rule(rule)
    p = _probs(target_probs, "target_probs")
    c = _check_candidates(candidates, p.size)
    out = np.zeros_like(p)
    top = int(np.argmax(p))
    if rule == "argmax":
        if top in c:
            out[top] = 1.0
            return out
        return p.copy()
    tau = float(typical_threshold(p, epsilon, delta))
    passed = [x for x in c if p[x] > tau]
    out[max(passed, key=lambda x: p[x]) if passed else top] = 1.0
    return out


def lossy_verify(rule, target_probs, candidates, rng, epsilon=MEDUSA_EPSILON, delta=MEDUSA_DELTA):
    """
    有损规则抽一次 -> (i, token)，i = 被接受的候选（-1 = 没有）。"typical" 不用随机数；"argmax" 没接受时用一个抽 p。
    """
    _rule(rule)
    p = _probs(target_probs, "target_probs")
    c = _check_candidates(candidates, p.size)
    top = int(np.argmax(p))
    if rule == "argmax":
        return (c.index(top), top) if top in c else (-1, int(sample_inverse_cdf(p, rng.random())))
    tau = float(typical_threshold(p, epsilon, delta))
    passed = [x for x in c if p[x] > tau]
    if not passed:
        return -1, top
    x = max(passed, key=lambda t: p[t])
    return c.index(x), x


def lossy_acceptance(rule, target_probs, draft_probs, k, epsilon=MEDUSA_EPSILON, delta=MEDUSA_DELTA):
    """
    草稿的前 k 名在有损规则下有一个被接受的概率 -> [...]（每个位置 0 或 1：两种规则接受与否都是确定的）。
    """
    _rule(rule)
    p = np.asarray(target_probs, dtype=np.float64)
    top = topk_candidates(draft_probs, k)
    if rule == "argmax":
        return np.any(top == np.argmax(p, axis=-1)[..., None], axis=-1).astype(np.float64)
    pc = np.take_along_axis(p, top, axis=-1)
    return np.any(pc > typical_threshold(p, epsilon, delta)[..., None], axis=-1).astype(np.float64)


def total_variation(a, b):  # [..., V], [..., V] -> [...]
    """TV(a, b) = ½ Σ |a − b| -> [...]。"""
    return 0.5 * np.abs(np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)).sum(-1)


def mean_ci(values, z=1.96):  # [n_positions, n_draws] -> (mean, half_width)
    """
    各位置的平均值（位置是固定的文本，只有每个位置上的抽样是随机的）和它的正态近似置信区间的半宽 -> (float, float)。

    【推导】估计量 = (1/P)·Σ_pos mean_pos；各位置独立抽样，方差 = (1/P²)·Σ_pos var_pos / n_draws（var 用 n − 1 的样本方差）；
    半宽 = z·√方差，z = 1.96 是 95% 的区间。【边界】每个位置至少 2 次抽样，否则 ValueError。
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.shape[1] < 2:
        raise ValueError(f"values 必须是 [位置数, 每个位置的抽样数 ≥ 2]（收到形状 {v.shape}）")
    P, n = v.shape
    var = v.var(axis=1, ddof=1).sum() / n / P ** 2
    return float(v.mean()), float(z * np.sqrt(var))
