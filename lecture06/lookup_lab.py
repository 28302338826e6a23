"""
lookup_lab —— 不用模型的草稿和会照抄的目标：prompt lookup（vLLM 的 n-gram 草稿）、归纳规则、
"会照抄"的目标模型 CopyingLM，以及草稿长度可变的投机解码（自适应 γ）。

每轮的验证和 speculative_generate 是同一个函数（decode_lab.verify_chain）。p = 目标、q = 草稿，同 decode_lab 的约定。
"""
import numpy as np

from decode_lab import _check_generation, _finish, _stop_set, _stopped, _vocab, adjust, verify_chain  # noqa: E402
from transformer_lab import sample_inverse_cdf, softmax  # noqa: E402（decode_lab 已把 lecture02 放到 sys.path 上）

__all__ = ["PromptLookup", "induction_token", "CopyingLM", "speculative_generate_adaptive"]


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


def speculative_generate_adaptive(target, draft, prompt, n_new, gamma, T, rng, gamma_max=None, counter_t=None,
                                  stop=None):
    """
    草稿长度可变的投机解码 -> (新 token 的 int 数组 [n_new], stats)；每轮的接受 / 拒绝和 speculative_generate 完全一样。

    【草稿】draft 是模型（有 session()）：每轮从它抽 γ_k 个；draft 是 PromptLookup：每轮取它 propose(seq, γ_k) 的
    最多 γ_k 个（q 是 one-hot，不消耗随机数；一个都没有时这一轮只让目标模型前向一次、抽 1 个 token）。
    【γ 怎么变】gamma_max 为 None：γ_k 固定为 gamma（模型草稿时输出和随机数的消耗与 speculative_generate 逐位相同，
    测试断言）。否则按 Hugging Face transformers 的 "heuristic" 规则：这一轮的草稿全部被接受，下一轮 γ + 2
    （不超过 gamma_max）；有拒绝就 γ − 1（不少于 1）；这一轮没有草稿（prompt lookup 找不到）时不变。
    stats：target_calls（轮数）、accepted（每轮接受的个数）、drafted（每轮草稿的个数）。
    stop：停止 token，规则同 decode_lab.speculative_generate。
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
    stop = _stop_set(stop)
    while len(seq) - n0 < n_new and not _stopped(seq, n0, stop):
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
        # 3–4. 依次接受 / 拒绝，然后修正 token 或额外的 token（和 speculative_generate 同一个函数）
        n, tok = verify_chain(ps, qs, drafts, rng)
        seq += drafts[:n] + [tok]
        accepted.append(n)
        drafted.append(k)
        # 5. 回滚
        t_sess.truncate(len(seq) - 1)
        if d_sess is not None:
            d_sess.truncate(len(seq) - 1)
        # 6. 下一轮的 γ
        if gamma_max is not None and k > 0:
            g = min(g + 2, gamma_max) if n == k else max(g - 1, 1)
    return _finish(seq, n0, n_new, stop), {"target_calls": calls, "accepted": accepted, "drafted": drafted}
