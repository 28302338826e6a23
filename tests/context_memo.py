"""
统计检验用的"按上下文记住 logits"的模型：同一个 TransformerLM，但带缓存的 forward 每一行的 logits 取自把这一行能看到的
token 当普通序列一次算完的结果，同一个上下文只算一次。

为什么可以：模型的 logits 只取决于它看到的 token。带缓存（含回滚、树形遮罩、只留被接受的路径）的 decode 和一次算完只差
float64 的舍入（< 1e-12），这由 test_decode_lab.test_cached_rolled_back_decoding_equals_full_logits 和
test_decode_lab_trees.test_every_node_scored_in_generation_equals_a_fresh_pass_over_its_path 逐行核对。所以投机解码的
输出分布和用原模型时一样；χ² 检验要抽几千次，提示固定、词表 6 个 token 时上下文却只有几百种，这样只算几百次前向。
缓存只记位置和 token（影子列表）；K/V 照样分配（KVCache 构造时的长度检查不变），但不再读写，所以 keep 只挪影子
列表（参数检查和 KVCache.keep 的相同，见 _TokenCache.keep）。
每次带缓存的 forward 的整个结果也按（缓存里的 token + 新 token、新 token 的个数、遮罩）记住：抽几千次时同一个调用
反复出现，命中时不再逐行查表、拼数组（给的是副本）。
FeatureMemoLM 另外记住特征（lm_head 的输入），给要目标特征的生成器（feature_decode_lab）用；它逐行查（要逐行交出特征）。
"""
import numpy as np

from decode_lab import TransformerLM
from kvcache_lab import KVCache


class _TokenCache(KVCache):
    """KVCache 加一个影子列表：第 i 个位置是哪个 token（rollback 只改 pos；keep 把留下的 token 跟着挪）。"""

    def __init__(self, cfg, batch, max_len=None):
        super().__init__(cfg, batch, max_len)
        self.shadow = [None] * self.max_len

    def keep(self, start, offsets):
        """
        和 KVCache.keep 一样检查参数（start 在 0..pos、offsets 是 0..pos − start − 1 里严格递增的整数，
        否则 ValueError），但只挪影子列表：K/V 在这个缓存里从来不读（logits 按上下文查表），不用搬。
        """
        if not (isinstance(start, (int, np.integer)) and not isinstance(start, bool) and 0 <= start <= self.pos):
            raise ValueError(f"start = {start!r} 超出范围：缓存里有 {self.pos} 个位置（允许 0..{self.pos}）")
        offs = list(offsets) if isinstance(offsets, (list, tuple)) else np.asarray(offsets).ravel().tolist()
        n_new = self.pos - start
        if (np.ndim(offsets) > 1 or not all(isinstance(o, (int, np.integer)) and not isinstance(o, bool) for o in offs)
                or any(not 0 <= o < n_new for o in offs) or any(b <= a for a, b in zip(offs, offs[1:]))):
            raise ValueError(f"offsets 必须是 0..{n_new - 1} 里严格递增的整数（start = {start} 之后有 {n_new} 个位置），"
                             f"收到 {offs}")
        kept = [self.shadow[start + o] for o in offs]
        self.shadow[start:start + len(kept)] = kept
        self.pos = start + len(kept)


class ContextMemoLM(TransformerLM):
    """base 的参数和配置；forward(toks, cache, …) 的每一行 = full_logits(这一行能看到的 token)[-1]（按上下文记住）。"""

    _memo_calls = True         # 整个调用的结果也记住（FeatureMemoLM 关掉：它要逐行交出特征）

    def __init__(self, base):
        super().__init__(base.params, base.cfg, base.name)
        self._rows = {}            # 上下文（token 元组）-> 它之后下一个 token 的 logits
        self._calls = {}           # (缓存里的 + 新的 token, 新 token 个数, 遮罩) -> 这次 forward 的结果 [1, n, V]
        self.n_passes = 0          # 真正算了几次一次算完的前向

    def new_cache(self, batch=1, max_len=None):
        return _TokenCache(self.cfg, batch, max_len)

    def _row(self, ctx):
        key = tuple(ctx)
        if key not in self._rows:
            rows = super().forward(np.asarray([ctx]))[0]      # 因果：第 j 行就是前 j + 1 个 token 之后的 logits
            self.n_passes += 1
            for j in range(len(ctx)):
                self._rows.setdefault(key[:j + 1], rows[j])
        return self._rows[key]

    def forward(self, toks, cache=None, counter=None, attn_mask=None, positions=None):
        if cache is None or counter is not None:
            return super().forward(toks, cache, counter, attn_mask, positions)
        toks = np.asarray(toks)
        if toks.ndim != 2 or toks.shape[0] != 1 or not isinstance(cache, _TokenCache):
            raise ValueError("ContextMemoLM 只接受批为 1、用自己 new_cache 建的缓存")
        n, p0 = toks.shape[1], cache.pos
        if p0 + n > cache.max_len:
            raise ValueError(f"序列长度 {p0 + n} 超过 KV cache 的长度 {cache.max_len}")
        new = toks[0].tolist() if toks.dtype.kind in "iu" else [int(t) for t in toks[0]]
        ctx_all = cache.shadow[:p0] + new
        mask = None if attn_mask is None else np.asarray(attn_mask, dtype=bool)
        key = (tuple(ctx_all), n, None if mask is None else (mask.shape, mask.tobytes()))
        got = self._calls.get(key) if self._memo_calls else None
        if got is None:
            rows = None if mask is None else mask.tolist()
            out = []
            for i in range(n):
                if rows is None:
                    ctx = ctx_all[:p0 + i + 1]
                else:
                    ctx = [t for t, v in zip(ctx_all, rows[i]) if v]
                out.append(self._row(ctx))
            got = np.asarray(out)[None]
            if self._memo_calls:
                self._calls[key] = got
        cache.shadow[p0:p0 + n] = new
        cache.pos = p0 + n
        return got.copy()


class FeatureMemoLM(ContextMemoLM):
    """
    ContextMemoLM，另外按上下文记住特征（lm_head 的输入，同一次一次算完的前向截下来的）：带缓存的 forward 在
    matmul_hook 设了时，把返回的这几行的特征交给它（op = "lm_head"，形状 [1, n, d]）——trained_draft_lab.
    forward_with_features 就是这样拿特征的，所以 Medusa / EAGLE 的生成器拿到的 logits 和特征都是一次算完的那一行。
    """

    _memo_calls = False        # 逐行查：每一行的特征都要交给 matmul_hook

    def __init__(self, base):
        super().__init__(base)
        self._feats = {}           # 上下文 -> 它最后一行的特征
        self._last = []            # 这次 forward 返回的各行的特征

    def _row(self, ctx):
        key = tuple(ctx)
        if key not in self._rows:
            box = {}

            def grab(op, li, x):
                if op == "lm_head":
                    box["f"] = x
                return x
            self.matmul_hook = grab
            rows = TransformerLM.forward(self, np.asarray([ctx]))[0]
            self.matmul_hook = None
            self.n_passes += 1
            for j in range(len(ctx)):
                self._rows.setdefault(key[:j + 1], rows[j])
                self._feats.setdefault(key[:j + 1], box["f"][0, j])
        self._last.append(self._feats[key])
        return self._rows[key]

    def forward(self, toks, cache=None, counter=None, attn_mask=None, positions=None):
        hook = self.matmul_hook
        if cache is None or counter is not None:
            return super().forward(toks, cache, counter, attn_mask, positions)
        self.matmul_hook, self._last = None, []
        try:
            out = super().forward(toks, cache, counter, attn_mask, positions)
        finally:
            self.matmul_hook = hook
        if hook is not None:
            hook("lm_head", -1, np.asarray(self._last)[None])
        return out
