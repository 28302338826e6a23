"""
rotation_lab —— 把模型换成一个数学上相同、激活更好量化的模型：折叠 RMSNorm 的权重、用正交矩阵旋转残差流（QuaRot）、Hadamard 矩阵。

【计算不变性】（QuaRot，Ashkboos et al. 2024，arXiv 2404.00456，§4；SliceGPT 的"computational invariance"）
RMSNorm(x)·g = x / rms(x) · g。第一步把 g 并进紧跟着的矩阵：(x/rms · g) @ W = (x/rms) @ (diag(g) W)（fold_norms）。
之后 RMSNorm 只剩 x / rms(x)，而 rms(x·Q) = rms(x)（Q 正交，Qᵀ Q = I，范数不变），所以
  (xQ / rms(xQ)) @ (Qᵀ W) = (x / rms(x)) @ W：
残差流整个乘 Q（词嵌入 E → E·Q，写进残差流的 wo、w_down 右乘 Q，从残差流读的 wq/wk/wv/w_gate/w_up、lm_head 左乘 Qᵀ）,
模型的输出一位不变（只差浮点舍入）——rotate_params。一个离群通道（残差流里固定的几维特别大）被 Q 摊到所有的维上。
【旋转残差流碰不到的地方】w_down 的输入（SiLU(gate)·up，d_ff 维）和 wo 的输入（注意力的输出）不在残差流里。QuaRot
在 w_down 之前加一个"在线"的 Hadamard：act → act·H（运行时做），w_down → Hᵀ·w_down（折进权重）——rotate_down_input
只做折进权重的那一半，运行时的那一半由激活量化的钩子做（actquant_lab）。V 和 O：每个头的 V 右乘 H_hd（折进 wv 的列），
注意力输出的那个头就也乘了 H_hd，wo 对应的行左乘 H_hdᵀ——全部折进权重，不用在线做（rotate_heads）。QuaRot 还在
o_proj 之前在线乘一个跨头的 Hadamard（阶 = 头数）：SmolLM2 有 9 个头，9 阶的 Hadamard 矩阵不存在（阶只能是 1、2 或
4 的倍数），这里不做。
【Hadamard 矩阵】元素 ±1、H Hᵀ = n·I；除以 √n 就是正交的。Sylvester 的构造（H_{2n} = [[H, H], [H, −H]]）只给 2 的幂；
576 = 2⁶·9、1536 = 2⁹·3 要一个非 2 的幂的"底"K 再和 Sylvester 的做 Kronecker 积：K 取 n/K 是 2 的幂、能用 Paley 的构造
造出来的最小的那个（Paley I：q 是 ≡ 3 (mod 4) 的素数，阶 q + 1；Paley II：q 是 ≡ 1 (mod 4) 的素数，阶 2(q + 1)）。
576 → 36 = 2·(17 + 1)（Paley II）⊗ 16，1536 → 12 = 11 + 1（Paley I）⊗ 128：和 QuaRot 的 get_hadK 选的底相同
（spcl/QuaRot fake_quant/hadamard_utils.py：它按 172、156、140、108、60、52、36、28、40、20、12 的顺序试，取 n/K 是
2 的幂的第一个；那些底是从 Sloane 的表里抄的矩阵，这里用 Paley 的构造自己造）。随机符号（QuaRot 的"randomized
Hadamard"）：每一行乘一个随机的 ±1，仍然正交。
"""
import math
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
_p = os.path.join(_HERE, "..", "lecture02")
if _p not in sys.path:
    sys.path.insert(0, _p)

from transformer_lab import config_like  # noqa: E402

__all__ = ["hadamard", "hadamard_base", "hadamard_kron", "Kron", "random_orthogonal", "fold_norms", "rotate_params",
           "rotate_down_input", "rotate_heads", "ORTHO_TOL"]

READS_STREAM = ("wq", "wk", "wv", "w_gate", "w_up")     # 从残差流读的矩阵：左乘 Qᵀ
WRITES_STREAM = ("wo", "w_down")                         # 写进残差流的矩阵：右乘 Q
NORMS = ("attn_norm", "mlp_norm")
# 正交性检查的容差：max|Q Qᵀ − I|。float64 里 QR 或 Hadamard 造的正交矩阵是 ~n·1e-16（n ≤ 几千时 < 1e-12）；
# 差出 1e-10 就不是"只差舍入"了（例如 float32 的矩阵，或者忘了除以 √n）。
ORTHO_TOL = 1e-10


# ---------------------------------------------------------------------------
# 正交矩阵
# ---------------------------------------------------------------------------
def _is_prime(q):
    return q >= 2 and all(q % p for p in range(2, int(math.isqrt(q)) + 1))


def _jacobsthal(q):  # -> [q, q]，Q[a, b] = χ(b − a)，χ 是模 q 的二次剩余特征（χ(0) = 0）
    chi = -np.ones(q, dtype=np.int64)
    chi[0] = 0
    chi[np.unique(np.arange(1, q) ** 2 % q)] = 1
    idx = (np.arange(q)[None, :] - np.arange(q)[:, None]) % q
    return chi[idx]


def _paley(K):
    """
    用 Paley 的构造造一个 K 阶的 Hadamard 矩阵（元素 ±1）-> [K, K] int，造不了时 None。

    【推导】Jacobsthal 矩阵 Q（q 阶，Q[a, b] = χ(b − a)）满足 Q Qᵀ = q·I − J、Q J = 0（J 全 1）。
    Paley I（q ≡ 3 mod 4，Q 反对称）：H = I + [[0, 1ᵀ], [−1, Q]]，阶 q + 1。
    Paley II（q ≡ 1 mod 4，Q 对称）：C = [[0, 1ᵀ], [1, Q]]（会议矩阵，C Cᵀ = q·I），
    H = C ⊗ [[1, −1], [−1, −1]] + I ⊗ [[1, 1], [1, −1]]，阶 2(q + 1)。这里 q 只取素数（素数幂要有限域的算术，不需要）。
    """
    q = K - 1
    if _is_prime(q) and q % 4 == 3:
        Q = _jacobsthal(q)
        S = np.zeros((K, K), dtype=np.int64)
        S[0, 1:], S[1:, 0], S[1:, 1:] = 1, -1, Q
        return np.eye(K, dtype=np.int64) + S
    if K % 2 == 0:
        q = K // 2 - 1
        if _is_prime(q) and q % 4 == 1:
            Q = _jacobsthal(q)
            C = np.zeros((q + 1, q + 1), dtype=np.int64)
            C[0, 1:], C[1:, 0], C[1:, 1:] = 1, 1, Q
            return (np.kron(C, np.array([[1, -1], [-1, -1]])) +
                    np.kron(np.eye(q + 1, dtype=np.int64), np.array([[1, 1], [1, -1]])))
    return None


def _sylvester(n):  # n = 2^e -> [n, n] int
    H = np.ones((1, 1), dtype=np.int64)
    while H.shape[0] < n:
        H = np.block([[H, H], [H, -H]])
    return H


def hadamard_base(n):
    """
    n 阶的 Hadamard 矩阵按什么造 -> (K, n // K)：K 阶的 Paley 矩阵（K = 1：没有）⊗ n/K 阶的 Sylvester 矩阵。

    【推导】n = m·2^e（m 奇数）。m = 1 时就是 Sylvester 的（K = 1）；否则 K 从 m、2m、4m、… 里取 Paley I 或 II
    能造的最小的一个（模块说明）。【边界】n 不是正整数、不是 1、2 或 4 的倍数（这样的 Hadamard 矩阵不存在）、
    或者找不到 Paley 能造的底（例如 92：92 阶的矩阵存在，但不是这样造的）时抛 ValueError。
    """
    if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 1):
        raise ValueError(f"Hadamard 矩阵的阶必须是正整数（收到 {n!r}）")
    n = int(n)
    if n > 2 and n % 4:
        raise ValueError(f"{n} 阶的 Hadamard 矩阵不存在：阶只能是 1、2 或 4 的倍数")
    m = n
    while m % 2 == 0:
        m //= 2
    if m == 1:
        return 1, n
    K = m
    while K <= n:
        if _paley(K) is not None:
            return K, n // K
        K *= 2
    raise ValueError(f"造不了 {n} 阶的 Hadamard 矩阵：{n} = {m}·{n // m}，{m}·2^j 里没有 Paley 构造能造的阶"
                     "（q + 1，q ≡ 3 mod 4 的素数；或 2(q + 1)，q ≡ 1 mod 4 的素数）。能造的例子：2 的幂、12·2^j、36·2^j")


def hadamard(n, rng=None):  # -> [n, n]
    """
    正交的 Hadamard 矩阵 H / √n -> [n, n] float64（元素 ±1/√n，H Hᵀ = I）。

    【推导】H = H_K ⊗ H_{n/K}（hadamard_base：Paley 的底和 Sylvester 的 2 的幂）；两个 Hadamard 矩阵的 Kronecker 积
    还是 Hadamard 矩阵（(A ⊗ B)(A ⊗ B)ᵀ = AAᵀ ⊗ BBᵀ = K·I ⊗ (n/K)·I = n·I）。
    【参数】rng：np.random.Generator 时每一行乘一个随机符号 s_i = ±1（u < 1/2 取 −1，u = rng.random()）：
    diag(s)·H/√n，QuaRot 的随机化 Hadamard（random_hadamard_matrix 的做法）；None 时不乘。
    【边界】造不了的阶抛 ValueError（见 hadamard_base）。
    """
    K, p = hadamard_base(n)
    H = _sylvester(p) if K == 1 else np.kron(_paley(K), _sylvester(p))
    H = H.astype(np.float64) / math.sqrt(n)
    if rng is not None:
        s = np.where(rng.random(n) < 0.5, -1.0, 1.0)
        H = s[:, None] * H
    return H


class Kron:
    """
    一个正交矩阵 M = diag(s)·(A ⊗ B)，不把它造出来（s 为 None 时没有 diag）：right(x) = x·M，left_t(w) = Mᵀ·w。

    【推导】x·(A ⊗ B)：把 x 的最后一维看成 [a, b]，(x·(A ⊗ B))[i·b + j] = Σ_{k,l} x[k·b + l]·A[k, i]·B[l, j]
    = (Aᵀ·X·B)[i, j]（X = x 的 [a, b] 形状）。每行 a·b·(a + b) 次乘加，不是 (a·b)² 次：576 = 36·16 时少 11 倍。
    rotate_params 等接受它代替 [n, n] 的数组（结果只差舍入）；在线的 Hadamard（激活量化的钩子）也用 right。
    """

    def __init__(self, A, B, signs=None):
        self.A, self.B = np.asarray(A, dtype=np.float64), np.asarray(B, dtype=np.float64)
        self.n = self.A.shape[0] * self.B.shape[0]
        self.signs = None if signs is None else np.asarray(signs, dtype=np.float64)
        self.shape = (self.n, self.n)

    def dense(self):  # -> [n, n]
        M = np.kron(self.A, self.B)
        return M if self.signs is None else self.signs[:, None] * M

    def right(self, x):  # [..., n] -> [..., n]
        x = np.asarray(x)
        if self.signs is not None:
            x = x * self.signs
        a, b = self.A.shape[0], self.B.shape[0]
        X = x.reshape(-1, a, b)
        return np.matmul(np.matmul(self.A.T, X), self.B).reshape(x.shape)

    def left_t(self, w):  # [n, m] -> [n, m]：Mᵀ·w
        return self.right(np.asarray(w).T).T


def hadamard_kron(n, rng=None):
    """hadamard(n, rng) 的不造出来的写法 -> Kron（同一个 rng 状态给出同一个矩阵：kron.dense() == hadamard(n, rng)）。"""
    K, p = hadamard_base(n)
    if K == 1:
        A, B = _sylvester(p) / math.sqrt(p), np.ones((1, 1))
    else:
        A, B = _paley(K) / math.sqrt(K), _sylvester(p) / math.sqrt(p)
    s = None if rng is None else np.where(rng.random(n) < 0.5, -1.0, 1.0)
    return Kron(A, B, s)


def random_orthogonal(n, rng):  # -> [n, n]
    """
    均匀（Haar）分布的随机正交矩阵 -> [n, n] float64。

    【推导】标准正态矩阵 A 的 QR 分解 A = QR，再把 Q 的第 j 列乘 sign(R_jj)（Mezzadri 2007：不乘的话分布不均匀）。
    """
    if not (isinstance(n, (int, np.integer)) and n >= 1):
        raise ValueError(f"n 必须是正整数（收到 {n!r}）")
    Q, R = np.linalg.qr(rng.standard_normal((n, n)))
    return Q * np.where(np.diag(R) < 0, -1.0, 1.0)[None, :]


def _check_orthogonal(Q, n, name):
    if isinstance(Q, Kron):
        if Q.n != n:
            raise ValueError(f"{name} 必须是 [{n}, {n}] 的矩阵（收到 [{Q.n}, {Q.n}]）")
        for f in (Q.A, Q.B):
            _check_orthogonal(f, f.shape[0], name + " 的 Kronecker 因子")
        if Q.signs is not None and not np.all(np.abs(Q.signs) == 1):
            raise ValueError(f"{name} 的符号必须是 ±1")
        return Q
    Q = np.asarray(Q)
    if Q.shape != (n, n):
        raise ValueError(f"{name} 必须是 [{n}, {n}] 的矩阵（收到形状 {Q.shape}）")
    err = float(np.abs(Q.astype(np.float64) @ Q.T.astype(np.float64) - np.eye(n)).max())
    if not err <= ORTHO_TOL:
        raise ValueError(f"{name} 不是正交矩阵：max|Q Qᵀ − I| = {err:.3g} > {ORTHO_TOL:g}")
    return Q.astype(np.float64)


def _right(Q, x):  # x·Q
    return Q.right(x) if isinstance(Q, Kron) else x @ Q


def _left_t(Q, w):  # Qᵀ·w
    return Q.left_t(w) if isinstance(Q, Kron) else Q.T @ w


# ---------------------------------------------------------------------------
# 改写参数（都返回新的 dict，不改传进来的）
# ---------------------------------------------------------------------------
def fold_norms(params, cfg):
    """
    把每个 RMSNorm 的权重并进紧跟着的矩阵 -> (params', cfg')，NumpyTransformer(params', cfg') 的输出和原来的只差舍入。

    【推导】(x/rms · g) @ W = (x/rms) @ (diag(g)·W)：attn_norm 并进 wq/wk/wv，mlp_norm 并进 w_gate/w_up，
    final_norm 并进 lm_head；这些 norm 的权重变成全 1。
    【共享的 lm_head】cfg.tied（lm_head 就是词嵌入的转置）而 final_norm 不全是 1 时，lm_head = diag(g)·Eᵀ 不再等于
    Eᵀ：lm_head 成了自己的矩阵，cfg' 的 tied = False（参数多了 d·V 个）。final_norm 已经全是 1 时保持共享。
    【类型】新矩阵和原来的同 dtype。params 不被修改（新的 dict、新的数组；没变的数组共用）。
    """
    P = dict(params)
    P["layers"] = []
    for L in params["layers"]:
        L2 = dict(L)
        for norm, mats in (("attn_norm", ("wq", "wk", "wv")), ("mlp_norm", ("w_gate", "w_up"))):
            g = L[norm]
            for m in mats:
                L2[m] = (g[:, None] * L[m]).astype(L[m].dtype, copy=False)
            L2[norm] = np.ones_like(g)
        P["layers"].append(L2)
    gf = params["final_norm"]
    if np.all(gf == 1):
        return P, cfg
    head = params["lm_head"]
    P["lm_head"] = np.ascontiguousarray((gf[:, None] * head).astype(head.dtype, copy=False))
    P["final_norm"] = np.ones_like(gf)
    return P, (config_like(cfg, tied=False) if cfg.tied else cfg)


def _check_folded(params):
    for i, L in enumerate(params["layers"]):
        for norm in NORMS:
            if not np.all(L[norm] == 1):
                raise ValueError(f"第 {i} 层的 {norm} 不全是 1：旋转前先 fold_norms（x/rms·g 和 Q 不交换，x/rms 和 Q 交换）")
    if not np.all(params["final_norm"] == 1):
        raise ValueError("final_norm 不全是 1：旋转前先 fold_norms")


def rotate_params(params, cfg, Q):
    """
    残差流乘正交矩阵 Q -> (params', cfg')：NumpyTransformer(params', cfg') 的 logits 和原来的只差舍入。

    【推导】残差流 x → x·Q：词嵌入 E → E·Q；写进残差流的 wo → wo·Q、w_down → w_down·Q；读残差流的
    wq/wk/wv/w_gate/w_up → Qᵀ·W、lm_head → Qᵀ·lm_head。RMSNorm（权重已是 1）：rms(xQ) = rms(x)，所以
    (xQ/rms(xQ))·QᵀW = (x/rms(x))·W（模块说明）。cfg.tied（final_norm 全是 1 才会还共享）：lm_head = (E·Q)ᵀ，仍然共享。
    【参数】Q：[d_model, d_model]，正交到 ORTHO_TOL（max|Q Qᵀ − I|）；或一个 Kron（hadamard_kron：同一个矩阵，不造出来，快）。
    【边界】Q 的形状不对、不正交，或者还有没折叠的 norm 权重（不全是 1）时抛 ValueError。
    """
    d = cfg.d_model
    Q = _check_orthogonal(Q, d, "Q")
    _check_folded(params)

    def same(a, like):
        return np.ascontiguousarray(a.astype(like.dtype, copy=False))

    P = dict(params)
    E = params["embed"]
    P["embed"] = same(_right(Q, E), E)
    P["layers"] = []
    for L in params["layers"]:
        L2 = dict(L)
        for m in READS_STREAM:
            L2[m] = same(_left_t(Q, L[m]), L[m])
        for m in WRITES_STREAM:
            L2[m] = same(_right(Q, L[m]), L[m])
        P["layers"].append(L2)
    P["lm_head"] = P["embed"].T if cfg.tied else same(_left_t(Q, params["lm_head"]), params["lm_head"])
    return P, cfg


def rotate_down_input(params, cfg, H):
    """
    在线 Hadamard 折进 w_down 的那一半 -> (params', cfg)：w_down → Hᵀ·w_down（每层）。

    【推导】act·w_down = (act·H)·(Hᵀ·w_down)（H 正交）。另一半 act → act·H 要在运行时做（w_down 的输入是 SiLU(gate)·up，
    非线性之后，折不进前面的矩阵）：actquant_lab 的钩子在量化 w_down 的输入之前做。只用这个函数、不做在线的那一半，
    模型就错了（测试核对两种情形）。
    【参数】H：[d_ff, d_ff] 正交（例如 hadamard(d_ff)），或一个 Kron。【边界】形状不对或不正交抛 ValueError。
    """
    H = _check_orthogonal(H, cfg.d_ff, "H")
    P = dict(params)
    P["layers"] = [dict(L, w_down=np.ascontiguousarray(_left_t(H, L["w_down"]).astype(L["w_down"].dtype, copy=False)))
                   for L in params["layers"]]
    return P, cfg


def rotate_heads(params, cfg, Hh):
    """
    V 和 O 的逐头旋转（全部折进权重）-> (params', cfg)：wv 每个 KV 头的列右乘 Hh，wo 每个 query 头的行左乘 Hhᵀ。

    【推导】第 h 个 query 头的输出 = softmax(…)·V_{h//G}；V 的每个头乘 Hh 以后，这个输出也乘了 Hh（右乘和按行的
    加权平均交换），wo 的第 h 块行 W_h → Hhᵀ·W_h 正好抵消：Σ_h (a_h Hh)(Hhᵀ W_h) = Σ_h a_h W_h。
    V 不转 RoPE，所以 V 可以随便转；缓存里的 V 也是转过的。wo 的输入（要量化的）变成每个头内部混过的。
    【参数】Hh：[head_dim, head_dim] 正交，或一个 Kron。【边界】形状不对或不正交抛 ValueError。
    """
    hd, H, Hkv = cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    Hh = _check_orthogonal(Hh, hd, "Hh")
    P = dict(params)
    P["layers"] = []
    for L in params["layers"]:
        wv, wo = L["wv"], L["wo"]
        d = wv.shape[0]
        wv2 = _right(Hh, wv.reshape(d, Hkv, hd)).reshape(d, Hkv * hd)
        wo2 = np.stack([_left_t(Hh, w) for w in wo.reshape(H, hd, wo.shape[1])]).reshape(H * hd, wo.shape[1])
        P["layers"].append(dict(L, wv=np.ascontiguousarray(wv2.astype(wv.dtype, copy=False)),
                                wo=np.ascontiguousarray(wo2.astype(wo.dtype, copy=False))))
    return P, cfg
