"""
tiled_quant_lab —— 只量化权重（INT8 每列一个 scale、INT4 每 32 个一组一个 scale）的矩阵，乘的时候一块一块地反量化：
每次把一块列（约 BUFFER_BYTES 字节的 float32）的整数码转成 float32 放进一个放得进缓存的缓冲区，乘完再转下一块。
内存里只有整数码和 scale：decode 一步从 DRAM 读的是每个权重 1 字节（INT8）或约 0.56 字节（INT4-g32：半字节 +
每 32 个一个 FP16 scale），不是 4 字节。

【外观】TiledQuantWeight(w, scheme)：一个权重对象，x @ W 给出 [M, N]（float32），有 shape、dtype、nbytes；
transformer_lab 的 linear 直接拿它乘（numpy 的 @ 遇到 __array_ufunc__ = None 的对象交给它的 __rmatmul__），
所以模型的数学一行也不抄。quantize_model(model, scheme) -> 一个新模型（浅拷贝：词嵌入、RoPE 表共用），每层的
四个融合矩阵（qkv、o、gate/up、down）和 lm_head 换成 TiledQuantWeight；dequantized_model(qmodel) -> 同样的整数码
一次反量化成 float32 矩阵的模型（测试：两个模型的 logits 只差浮点舍入）。decode_step_seconds 量一步 decode。

【量化的是什么】融合以后的矩阵（NumpyTransformer 把 RMSNorm 的权重、1/√hd 并进了矩阵，见它的说明）：
一个只量化权重的推理引擎量化的也是它真正去乘的那个矩阵。整数码 round-half-even（np.round，prereq3/numfmt.quantize_int
的规则），scale 存成 FP16（同 numfmt：全 0 的列 / 组 scale = 0）。INT8：q ∈ [−127, 127]，INT4：q ∈ [−7, 7]。
【一块的算法】INT8：out[:, 块] = (x @ float32(q[:, 块])) · s[块]——每列一个 scale，乘完再乘（和先反量化再乘只差舍入）。
INT4-g32：scale 沿输入维每 32 个一个，必须先乘进缓冲区：buf = (半字节 − 8) · s（按组广播），out[:, 块] = x @ buf。
"""
import copy
import os
import sys
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("prereq3", "lecture02", "lecture01"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)

from numfmt import quantize_int  # noqa: E402

__all__ = ["TiledQuantWeight", "TILED_SCHEMES", "BUFFER_BYTES", "quantize_model", "dequantized_model",
           "decode_step_seconds", "model_weight_bytes"]

TILED_SCHEMES = {"int8": (8, None), "int4-g32": (4, 32)}     # 方案 -> (位数, 分组；None = 每列一个 scale)
BUFFER_BYTES = 1 << 20   # 一块反量化出来的 float32 的大小（选的：本机每核 1 MiB L2；tests/bench 里可以换）


class TiledQuantWeight:
    """
    一个只量化权重的矩阵 [K, N]（见模块说明）。x @ self -> [M, N] float32。

    【参数】w：[K, N] 的浮点矩阵；scheme："int8" 或 "int4-g32"；buffer_bytes：一块 float32 的字节数（决定块的列数
    nt = buffer_bytes / (4K)，取 32 的倍数，至少 32）。
    【边界】（ValueError）w 不是二维；未知方案；INT4-g32 的 K 不是 32 的倍数。
    """

    __array_ufunc__ = None          # ndarray @ self -> self.__rmatmul__(ndarray)

    def __init__(self, w, scheme, buffer_bytes=BUFFER_BYTES):
        if scheme not in TILED_SCHEMES:
            raise ValueError(f"未知的方案 {scheme!r}；可用：{', '.join(TILED_SCHEMES)}")
        w = np.asarray(w, dtype=np.float64)
        if w.ndim != 2:
            raise ValueError(f"权重必须是二维 [K, N]（收到形状 {w.shape}）")
        bits, group = TILED_SCHEMES[scheme]
        K, N = w.shape
        if group and K % group:
            raise ValueError(f"{scheme}：输入维 K = {K} 必须是 {group} 的倍数")
        deq, scale = quantize_int(w, bits, "group" if group else "channel", group)
        self.scheme, self.shape, self.dtype = scheme, (K, N), np.dtype(np.float32)
        self.nt = max(32, (int(buffer_bytes) // (4 * K)) // 32 * 32)
        if group:
            s = scale.T.reshape(K // group, N)                   # [组数, N]
            sfull = np.repeat(s, group, axis=0)                  # [K, N]
        else:
            s = scale.reshape(N)
            sfull = np.broadcast_to(s, (K, N))
        safe = np.where(sfull > 0, sfull, 1.0)
        q = np.round(deq / safe).astype(np.int8)                 # 整数码（deq = q·s 在 float64 里精确）
        self.scale = s.astype(np.float16)                        # 存 FP16（本来就是 FP16 能表示的值）
        self._s32 = self.scale.astype(np.float32)
        self.tiles = []                                          # 每块一个连续的数组：[K, nt] int8 或 [K/2, nt] uint8
        for j0 in range(0, N, self.nt):
            blk = q[:, j0:j0 + self.nt]
            if bits == 4:
                u = (blk + 8).astype(np.uint8)                   # 1..15
                blk = u[0::2] | (u[1::2] << 4)                   # 相邻两行拼一个字节：低半字节是偶数行
            self.tiles.append(np.ascontiguousarray(blk))
        self._buf = np.empty((K, self.nt), dtype=np.float32)     # 一块反量化的缓冲区（重复使用：留在缓存里）

    @property
    def nbytes(self):
        """存着的字节：整数码 + FP16 scale（decode 一步要从内存读的）。"""
        return sum(t.nbytes for t in self.tiles) + self.scale.nbytes

    def _tile(self, i):  # -> [K, nt_i] float32（缓冲区的一个视图）
        """第 i 块反量化进缓冲区：INT8 只转类型（scale 在乘完以后）；INT4-g32 解半字节、减 8、乘组的 scale。"""
        t = self.tiles[i]
        K = self.shape[0]
        j0 = i * self.nt
        n = t.shape[1]
        buf = self._buf[:, :n]
        if self.scheme == "int8":
            np.copyto(buf, t, casting="unsafe")
            return buf
        np.bitwise_and(t, 15, out=buf[0::2], casting="unsafe")
        np.right_shift(t, 4, out=buf[1::2], casting="unsafe")
        b3 = buf.reshape(K // 32, 32, n)
        b3 -= 8.0
        b3 *= self._s32[:, None, j0:j0 + n]
        return buf

    def dequantize(self):
        """整个矩阵一次反量化 -> [K, N] float32（"反量化一次"的对照模型用）。"""
        out = np.empty(self.shape, dtype=np.float32)
        for i in range(len(self.tiles)):
            j0 = i * self.nt
            b = self._tile(i)
            out[:, j0:j0 + b.shape[1]] = b * self._s32[j0:j0 + b.shape[1]] if self.scheme == "int8" else b
        return out

    def __rmatmul__(self, x):  # [M, K] -> [M, N]
        x = np.asarray(x)
        if x.ndim != 2 or x.shape[1] != self.shape[0]:
            raise ValueError(f"x 必须是 [M, {self.shape[0]}]（收到形状 {x.shape}）")
        x = x.astype(np.float32, copy=False)
        out = np.empty((x.shape[0], self.shape[1]), dtype=np.float32)
        for i in range(len(self.tiles)):
            j0 = i * self.nt
            b = self._tile(i)
            out[:, j0:j0 + b.shape[1]] = x @ b
        if self.scheme == "int8":
            out *= self._s32
        return out


def quantize_model(model, scheme, buffer_bytes=BUFFER_BYTES, lm_head=True):
    """
    一个 float32 的 NumpyTransformer -> 浅拷贝的新模型，每层四个融合矩阵（和 lm_head）换成 TiledQuantWeight。
    原模型不变（新模型的 _layers 是新的 list）。
    """
    if np.dtype(model.cfg.dtype) != np.float32:
        raise ValueError(f"只量化 float32 的模型（收到 {model.cfg.dtype}）")
    q = copy.copy(model)
    q._layers = [tuple(TiledQuantWeight(w, scheme, buffer_bytes) for w in L) for L in model._layers]
    if lm_head:
        q._head = TiledQuantWeight(model._head, scheme, buffer_bytes)
    return q


def dequantized_model(qmodel):
    """quantize_model 的结果 -> 同样的整数码一次反量化成 float32 矩阵的模型（对照：乘法是普通的 x @ W）。"""
    d = copy.copy(qmodel)
    d._layers = [tuple(w.dequantize() for w in L) for L in qmodel._layers]
    if isinstance(qmodel._head, TiledQuantWeight):
        d._head = qmodel._head.dequantize()
    return d


def model_weight_bytes(model):
    """decode 一步读的权重字节：每层四个矩阵 + lm_head（TiledQuantWeight 按它存着的字节，ndarray 按 nbytes）。"""
    mats = [w for L in model._layers for w in L] + [model._head]
    return sum(w.nbytes for w in mats)


def decode_step_seconds(model, batch, ctx, steps=3, token=100):
    """
    一步 decode 的秒数（steps 步里最快的）：batch 个序列、每个已缓存 ctx 个位置，每步喂一个 token。

    【量法】缓存的前 ctx 个位置直接当作已写入（pos = ctx；里面是零）：一步的时间和缓存里的值无关，这样不用先 prefill。
    """
    cache = model.new_cache(batch, ctx + steps)
    cache.pos = ctx
    toks = np.full((batch, 1), token % model.cfg.vocab, dtype=np.int64)
    best = float("inf")
    for _ in range(steps):
        t0 = time.perf_counter()
        model.forward(toks, cache)
        best = min(best, time.perf_counter() - t0)
    return best
