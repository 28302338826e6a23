"""
kvcache_lab —— KV cache：预先分配的数组 + 一个位置 pos，回滚、只留下被接受的路径（树形验证）、树形注意力的遮罩，
以及写入时就量化的存储。

【做法】预先分配好的数组 + 一个位置 pos（likejazz/llama3.np、karpathy/nanochat 的做法）：
写入第 pos.. 个位置；回滚就是把 pos 往回挪（先检查不越界）。回滚后再喂同样的 token，得到的状态和从头算一样。
"""
import numpy as np

__all__ = ["KVCache", "tree_mask", "quantizing_store"]


class KVCache:
    """
    预先分配的 KV cache：k, v 形状 [层, B, Hkv, max_len, head_dim]，pos = 已经写入的位置数。

    rollback(n)：丢掉最后 n 个位置（只挪 pos；被丢掉的位置之后会被覆盖）。
    repeat(n)：批为 1 的缓存复制成 n 条（同一个提示只 prefill 一次）。
    keep(start, offsets)：只留下 start 以后的几个位置、按顺序挪到一起（树形验证之后留下被接受的路径）。
    quant：None（默认：按模型的 dtype 原样存，float64 或 float32）或者一个函数 f(块) -> 同形状的块，K 和 V 每次写进缓存时先经过它
    （量化再反量化：缓存里存的就是低精度的值；第 3 讲 06 用它，见本文件末尾的 quantizing_store）。
    """

    def __init__(self, cfg, batch, max_len=None, quant=None):
        max_len = cfg.max_seq if max_len is None else max_len
        if max_len > cfg.max_seq:
            raise ValueError(f"KV cache 长度 {max_len} 超过模型的上下文 max_seq = {cfg.max_seq}")
        shape = (cfg.n_layers, batch, cfg.n_kv_heads, max_len, cfg.head_dim)
        dtype = np.dtype(getattr(cfg, "dtype", "float64"))                # 和模型同一个浮点类型
        self.k = np.zeros(shape, dtype=dtype)
        self.v = np.zeros(shape, dtype=dtype)
        if quant is not None:
            self.k, self.v = quantizing_store(self.k, quant), quantizing_store(self.v, quant)
        self.batch, self.max_len, self.pos = batch, max_len, 0

    def rollback(self, n):
        """丢掉最后 n 个位置。n 必须在 0..pos 之间，否则抛 ValueError。"""
        if not 0 <= n <= self.pos:
            raise ValueError(f"回滚 {n} 个位置超出范围：缓存里只有 {self.pos} 个位置（允许 0..{self.pos}）")
        self.pos -= n

    def repeat(self, n):
        """
        批为 1 的缓存复制成 n 条 -> 新的 KVCache（同样的 max_len 和 pos）：同一个提示只 prefill 一次，再分给 n 条序列。

        【边界】批不是 1、n 不是 ≥ 1 的整数、缓存写入时量化（quant）时抛 ValueError。
        """
        if self.batch != 1:
            raise ValueError(f"只能复制批为 1 的缓存（这个的批是 {self.batch}）")
        if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1):
            raise ValueError(f"n 必须是 ≥ 1 的整数（收到 {n!r}）")
        if isinstance(self.k, _QuantizingStore):
            raise ValueError("写入时量化的缓存（quant）不能复制：复制出来的数组不再经过 quant")
        out = object.__new__(KVCache)
        out.k, out.v = np.repeat(self.k, n, axis=1), np.repeat(self.v, n, axis=1)
        out.batch, out.max_len, out.pos = n, self.max_len, self.pos
        return out

    def keep(self, start, offsets):
        """
        只留下第 start 个位置以后的 offsets 这几个位置，按原来的顺序挪到 start, start + 1, …；pos = start + len(offsets)。

        【用途】树形验证之后留下被接受的那条路径（树的节点在缓存里按节点顺序排，路径上的节点不相邻）：
        路径节点的 K 已经按它的深度转过 RoPE，挪到 start + 深度 − 1 之后，缓存和从头喂"前缀 + 这条路径"的一样。
        【参数】offsets：相对 start 的下标，严格递增（批里每个序列留同样的位置）。
        【边界】start 不在 0..pos、offsets 不是 0..pos − start − 1 里严格递增的整数时抛 ValueError；
        offsets 为空就是 rollback(pos − start)。
        """
        if not (isinstance(start, (int, np.integer)) and not isinstance(start, bool) and 0 <= start <= self.pos):
            raise ValueError(f"start = {start!r} 超出范围：缓存里有 {self.pos} 个位置（允许 0..{self.pos}）")
        offs = np.asarray(offsets)
        n_new = self.pos - start
        if offs.size == 0:
            offs = np.zeros(0, dtype=np.int64)
        if (offs.ndim != 1 or offs.dtype.kind not in "iu" or np.any(offs < 0) or np.any(offs >= n_new)
                or np.any(np.diff(offs) <= 0)):
            raise ValueError(f"offsets 必须是 0..{n_new - 1} 里严格递增的整数（start = {start} 之后有 {n_new} 个位置），"
                             f"收到 {list(np.ravel(offsets))}")
        m = len(offs)
        self.k[:, :, :, start:start + m] = self.k[:, :, :, start + offs]   # 右边先取出副本，重叠也没关系
        self.v[:, :, :, start:start + m] = self.v[:, :, :, start + offs]
        self.pos = start + m


def tree_mask(parents, n_past):  # [n] -> [n, n_past + n] bool, [n] int
    """
    一棵 token 树的注意力遮罩和 RoPE 位置 -> (mask, positions)，交给 NumpyTransformer.forward 一次算完整棵树。

    【参数】parents[i]：第 i 个新位置的父节点，-1 = 接在已缓存的 n_past 个位置后面，否则是更早的新位置的下标 0..i−1
    （节点按"父节点在前"的顺序排，例如按层）。
    mask[i, j] = True 表示新位置 i 能看第 j 个位置：缓存里的 n_past 个位置全都能看，新位置里只看自己的祖先和自己。
    positions[i] = n_past + depth(i) − 1，depth = 到缓存的步数（父节点是 -1 的节点深度为 1）：兄弟节点位置相同。
    【边界】链 parents = [-1, 0, 1, …] 得到普通的因果遮罩和位置 n_past, n_past + 1, …；
    空的或不是一维的 parents、parents[i] 不在 -1..i−1 里、n_past < 0 抛 ValueError。
    """
    arr = np.asarray(parents)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"parents 必须是非空的一维整数列表（收到 {parents!r}）")
    par = list(arr)
    if not (isinstance(n_past, (int, np.integer)) and not isinstance(n_past, bool) and n_past >= 0):
        raise ValueError(f"n_past 必须是 ≥ 0 的整数（收到 {n_past!r}）")
    n = len(par)
    mask = np.zeros((n, n_past + n), dtype=bool)
    mask[:, :n_past] = True
    depth = np.ones(n, dtype=np.int64)
    for i, a in enumerate(par):
        if not (isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) and -1 <= a < i):
            raise ValueError(f"parents[{i}] = {a!r}：父节点必须是 -1（接在缓存后面）或更早的节点 0..{i - 1}")
        if a >= 0:
            mask[i, n_past:n_past + i] = mask[a, n_past:n_past + i]   # 父节点的祖先（和父节点自己）
            depth[i] = depth[a] + 1
        mask[i, n_past + i] = True
    return mask, n_past + depth - 1


# ---------------------------------------------------------------------------
# 量化的 KV cache（第 3 讲 06 用）：写进缓存时量化
# ---------------------------------------------------------------------------
class _QuantizingStore(np.ndarray):
    """
    KV cache 的存储数组：cache.k[...] = 块 时先把块交给 quant（量化再反量化）再存；取出来的是普通的 ndarray 视图。

    前向（NumpyTransformer.forward）不用改一个字：它本来就是"写第 p0..S 个位置、再读 0..S"，
    写的那一刻就是量化的那一刻，和真实的推理引擎一样（每个新 token 的 K、V 写进缓存时量化）。
    KVCache.keep 挪位置时，挪过去的值会再经过 quant 一次：quant 必须是幂等的（量化已经量化过的值不变；
    quant_lab.kv_quantizer 的格式都是，测试核对）。
    """

    def __setitem__(self, idx, value):
        np.ndarray.__setitem__(self, idx, self._quant(np.asarray(value, dtype=self.dtype)))

    def __getitem__(self, idx):
        return np.ndarray.__getitem__(self.view(np.ndarray), idx)


def quantizing_store(arr, quant):
    """把 arr 包成写入时经过 quant 的存储（共享 arr 的内存）-> _QuantizingStore。"""
    if not callable(quant):
        raise ValueError(f"quant 必须是函数 f(块) -> 同形状的块（收到 {quant!r}）")
    store = arr.view(_QuantizingStore)
    store._quant = quant
    return store
