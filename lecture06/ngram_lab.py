"""
ngram_lab —— 稀疏的 n 元语法草稿：只存见过的 (上下文, 下一个 token)，词表再大也放得下；接口和 decode_lab.NGramLM 一样。

【为什么要稀疏】decode_lab.NGramLM 存一张稠密的 [V, V] 表；真实模型的词表 V = 49152 时那是 2.4e9 个数，放不下。
几千个 token 的训练文本里见过的二元组只有几千个：只存这些，别的用平滑补上。
【接口】session()：logits(seq, counter=None) 返回"把 seq 里还没喂的 token 喂进去"得到的那几行 logits（对数概率），
truncate(m) 退回到前 m 个 token——和 decode_lab 的会话一样，所以 speculative_generate 可以直接用它当草稿；
full_logits(toks) 一次算完（decode_lab.alphas_on_text 用它）。.cfg 只有 vocab 和 max_seq（上下文不限）两个字段。
"""
import math
from types import SimpleNamespace

import numpy as np

__all__ = ["SparseNGramLM", "SMOOTHINGS"]

SMOOTHINGS = ("witten-bell", "add-k")


def _check_int(name, v, lo):
    if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= lo):
        raise ValueError(f"{name} 必须是 ≥ {lo} 的整数（收到 {v!r}）")


class SparseNGramLM:
    """
    稀疏的 n 元语法模型（n = order）：P(下一个 token | 最后 n − 1 个 token)，平滑方式二选一。

    【平滑】（c(h, b) = 上下文 h 后面跟 b 的次数，c(h) = Σ_b c(h, b)，u(h) = h 后面出现过几种不同的 token）
    - "witten-bell"（默认，插值的 Witten–Bell 回退）：P_m(b | h) = (c(h, b) + u(h)·P_{m−1}(b | h′)) / (c(h) + u(h))，
      h′ = h 去掉最早的一个 token（低一阶的上下文）；h 没见过（c(h) = 0）时 P_m = P_{m−1}。
      最低一阶是加 k 平滑的一元分布 P_1(b) = (c(b) + k) / (N + k·V)，N = 训练 token 数。每一阶都是概率分布的凸组合，
      所以和为 1（测试断言）。
    - "add-k"（只用于 order = 2）：P(b | a) = (c(a, b) + k) / (c(a) + k·V)，和 decode_lab.NGramLM.fit 一模一样
      （小词表上测试逐格对照那张稠密的表）。V 很大时它几乎把所有概率给没见过的 token：对真实模型不合用。
    【上下文】位置 t 的那一行预测 t + 1，用 seq[t − n + 2 .. t]；序列开头不足 n − 1 个 token 时用能用的最长上下文（低阶）。
    【参数】fit(token_lists, vocab, order=2, smoothing="witten-bell", k=0.1)：token_lists 是若干条长短不一的 token 序列
    （list 的 list；跨序列的相邻 token 不算一对）。
    【边界】order < 1、k ≤ 0、未知的平滑方式、add-k 配 order ≠ 2、token 越界、没有训练 token：ValueError。
    """

    def __init__(self, counts, unigram, vocab, order, smoothing, k, name):
        self.counts, self.unigram = counts, unigram         # {上下文元组: (下一个 token 的 id 数组, 次数数组)}, [V]
        self.order, self.smoothing, self.k, self.name = order, smoothing, k, name
        self.cfg = SimpleNamespace(vocab=vocab, max_seq=math.inf)
        self._log_unigram = np.log(unigram)

    @classmethod
    def fit(cls, token_lists, vocab, order=2, smoothing="witten-bell", k=0.1, name=""):
        _check_int("词表大小 vocab", vocab, 1)
        _check_int("阶数 order", order, 1)
        if smoothing not in SMOOTHINGS:
            raise ValueError(f"未知的平滑方式 {smoothing!r}；可用：{', '.join(SMOOTHINGS)}")
        if smoothing == "add-k" and order != 2:
            raise ValueError(f"add-k 平滑只用于二元语法（order = 2，收到 {order}）：它就是 decode_lab.NGramLM 的表")
        if not k > 0:
            raise ValueError(f"平滑常数 k 必须为正（收到 {k}）")
        seqs = [[int(t) for t in np.asarray(s).ravel()] for s in token_lists]
        flat = [t for s in seqs for t in s]
        if not flat:
            raise ValueError("没有训练 token：至少要一条非空的序列")
        if min(flat) < 0 or max(flat) >= vocab:
            raise ValueError(f"训练 token 必须在 0..{vocab - 1} 之间（收到 {min(flat)}..{max(flat)}）")
        uni = np.bincount(np.asarray(flat), minlength=vocab).astype(np.float64)
        unigram = (uni + k) / (uni.sum() + k * vocab)
        raw = {}
        for s in seqs:
            for t in range(1, len(s)):
                for m in range(1, min(order - 1, t) + 1):      # 上下文长 m = 1..order − 1
                    key = tuple(s[t - m:t])
                    d = raw.setdefault(key, {})
                    d[s[t]] = d.get(s[t], 0) + 1
        counts = {}
        for key, d in raw.items():
            ids = np.array(sorted(d), dtype=np.int64)
            counts[key] = (ids, np.array([d[i] for i in ids], dtype=np.float64))
        label = name or f"{order} 元语法（{smoothing}，{len(flat)} 个 token）"
        return cls(counts, unigram, vocab, order, smoothing, k, label)

    def probs_after(self, context):  # 一串 token -> [V]
        """上下文（最后 order − 1 个 token 起作用）之后下一个 token 的分布 -> 和为 1 的 [V]。"""
        context = [int(t) for t in context]
        V = self.cfg.vocab
        if self.smoothing == "add-k":
            p = np.full(V, self.k)
            total = self.k * V
            if context and (context[-1],) in self.counts:
                ids, c = self.counts[(context[-1],)]
                p[ids] += c
                total += c.sum()
            return p / total
        p = self.unigram.copy()
        for m in range(1, min(self.order - 1, len(context)) + 1):
            key = tuple(context[len(context) - m:])
            if key not in self.counts:
                break                 # 更长的上下文也不可能见过（它的后缀就没见过）
            ids, c = self.counts[key]
            tot, u = c.sum(), ids.size
            p *= u / (tot + u)
            p[ids] += c / (tot + u)
        return p

    def _rows(self, seq, first, last):  # -> [last − first, V]：位置 first..last−1 各一行
        out = np.empty((last - first, self.cfg.vocab))
        for r, t in enumerate(range(first, last)):
            out[r] = np.log(self.probs_after(seq[max(0, t + 2 - self.order):t + 1]))
        return out

    def full_logits(self, toks):  # [n_seq, len] -> [n_seq, len, V]
        """每个位置的下一个 token 的对数概率（一次算完；和会话逐个喂的结果完全相同）。"""
        toks = np.asarray(toks)
        if toks.ndim != 2:
            raise ValueError(f"toks 必须是形状 [批, 长度] 的数组（收到形状 {toks.shape}）")
        return np.stack([self._rows([int(t) for t in row], 0, toks.shape[1]) for row in toks])

    def session(self):
        return _NGramSession(self)


class _NGramSession:
    """SparseNGramLM 的增量状态：只记喂过几个 token（n 元语法没有缓存，上下文直接从 seq 里取）。"""

    def __init__(self, model):
        self.model, self.fed = model, 0

    def logits(self, seq, counter=None):  # -> [新喂的个数, V]
        if len(seq) <= self.fed:
            raise ValueError("没有新的 token 可喂：先 truncate 到更短的前缀")
        first, self.fed = self.fed, len(seq)
        return self.model._rows([int(t) for t in seq], first, len(seq))

    def truncate(self, m):
        if m < self.fed:
            self.fed = m
