"""
trained_draft_lab —— 训练出来的草稿：Medusa 头、EAGLE 式的特征草稿（numpy，前向和反向都手写）、Adam 训练、每个草稿 token
的账。用它们的精确生成器 medusa_generate / eagle_generate 和 T = 0 的精确轮次在 feature_decode_lab。

p = 目标、q = 草稿，同 decode_lab 的约定。

【特征】目标在一个位置的"特征" f = 最后的 RMSNorm 之后、乘 lm_head 之前的向量（NumpyTransformer.rms_scale(x)：RMSNorm 的
权重 g 和 √d 已并进 lm_head，所以 lm_head(f) 就是这个位置的 logits）。引擎的 LLMEngine(…, keep_hidden=True) 记下的
req.hidden 就是它；生成时 forward_with_features 在同一次前向里取（matmul_hook 截下 lm_head 的输入）。
【两个草稿】（都只用目标自己的 lm_head 和 rms_scale / embed，数学不抄一份；lm_head 冻结、不训练）
- Medusa（Cai et al. 2024，arXiv 2401.10774）：k 个头，第 i 个头从 f_t 预测 t 之后第 i + 1 个 token：
  u_i = f + SiLU(f·W_i + b_i)（一个残差块），logits_i = lm_head(u_i)。偏离论文：论文每个头有自己的 d × V 输出层
  （从 lm_head 初始化、再训练）；这里所有头共用冻结的 lm_head（一个 576 × 49152 的层 float16 就是 56.6 MB）。
  W_i、b_i 初始化为 0（Medusa 代码 medusa/model/medusa_model.py 的 ResBlock 把权重初始化为 0、"identity mapping"：
  开始时每个头就是 lm_head 本身）。
- EAGLE 式（Li et al. 2024，arXiv 2401.15077）：输入 (f_t, 位置 t 抽出的 token x_{t+1} 的嵌入 e)，预测 f_{t+1}：
  a = [f, rms_scale(e)]·W_in + b_in（2d → d），u = a + SiLU(a·W_1 + b_1)；lm_head(u) 给下一个 token 的 q；自回归时把 u
  当成下一步的 f。和 EAGLE 的差别：EAGLE 在 FC 之后是一整个解码层（带自己的 KV cache 的自注意力 + SwiGLU MLP），
  每一步看得到之前所有位置的特征；这里没有注意力，只看 (f_t, x_{t+1}) 这一对（一阶马尔可夫）。W_in 初始化为 [I; 0]
  （开始时 u = f），W_1 为 0。损失 = 交叉熵 + FEAT_WEIGHT × ‖u − f_{t+1}‖²（EAGLE 用 smooth L1 的回归加 0.1 倍的分类）。
- 草稿词表（FR-Spec，Zhao et al. 2025，arXiv 2502.14856）：vocab_ids 给了时草稿的 lm_head 只取这几列（同一份冻结的
  权重），q 在词表之外是 0；目标照样在整个词表上验证，所以仍然精确（拒绝采样允许 q(x) = 0）。
【尺度】特征 f 的 L2 范数约为 1（rms_scale 除的是 √(Σx²)，不是均方根），每个分量约 1/√d：草稿在 x = √d·f 上算
（每个分量的均方根约 1，和一般的 RMSNorm 之后的隐状态一样，Adam 的学习率才有意义），输出除回 √d 再乘 lm_head。
训练时把 √d·f 和 head/√d 交给 medusa_loss / eagle_loss（train_scale），和 DraftHead 的前向是同一个函数。
【验证】（feature_decode_lab）medusa_generate：Medusa 的固定树（每层 top-w 个候选的笛卡儿积：头不看路径，同一层的候选对每个父节点都一样），
一次目标前向（树形注意力）给整棵树打分，从根往下按点质量规则（distinct_lab.topk_draft_verify）验证。
eagle_generate：草稿在特征空间里自回归地抽 γ 个（每个从它自己的 q 抽），verify_chain 验证（Leviathan 的规则）。
两者输出的分布都正好是 p（测试按随机数的每种结局精确枚举），T = 0 时就是贪心。
【随机数】只用 rng.random()（CDF 反查）。训练只在打乱顺序时用 rng（初始化是确定的）。
"""
import os
import sys

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
for _sub in ("lecture01", "lecture02"):
    _p = os.path.join(_HERE, "..", _sub)
    if _p not in sys.path:
        sys.path.insert(0, _p)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


__all__ = ["FEAT_WEIGHT", "ADAM", "forward_with_features", "target_features", "DraftHead", "init_medusa",
           "init_eagle", "medusa_loss", "eagle_loss", "eagle_inputs", "adam_step", "train_epochs",
           "draft_params", "draft_cost", "train_scale"]

FEAT_WEIGHT = 1.0          # EAGLE 式损失里特征回归的权重（选的，不是论文的数）
ADAM = {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8}     # Adam 的常数（Kingma & Ba 2015 的默认值）


# ---------------------------------------------------------------------------
# 目标的特征
# ---------------------------------------------------------------------------
def forward_with_features(model, toks, cache=None, attn_mask=None, positions=None):  # [n] -> [n, V], [n, d]
    """
    目标一次前向（写进 cache）-> (logits [n, V], 特征 [n, d])：特征是 lm_head 的输入（见模块说明），同一次前向截下来的。

    【做法】临时把 model.matmul_hook 换成一个记下 op == "lm_head" 的输入、再交给原来的钩子的函数，前向之后换回去。
    """
    box = {}
    old = model.matmul_hook

    def hook(op, li, x):
        x = x if old is None else old(op, li, x)
        if op == "lm_head":
            box["f"] = x
        return x

    model.matmul_hook = hook
    try:
        logits = model.forward(np.asarray(toks)[None, :], cache, None, attn_mask, positions)[0]
    finally:
        model.matmul_hook = old
    return logits, box["f"][0]


def target_features(model, toks):  # [n] -> [n, V], [n, d]
    """一段 token 一次算完（teacher forcing）-> (logits, 特征)。"""
    return forward_with_features(model, toks)


# ---------------------------------------------------------------------------
# 两个草稿的参数和前向 / 反向（手写）
# ---------------------------------------------------------------------------
def init_medusa(d, k, dtype=np.float64):
    """k 个 Medusa 头的参数 -> {"w": [k, d, d], "b": [k, d]}，全是 0（开始时每个头的输出 = lm_head(f)）。"""
    return {"w": np.zeros((k, d, d), dtype=dtype), "b": np.zeros((k, d), dtype=dtype)}


def init_eagle(d, dtype=np.float64):
    """EAGLE 式草稿的参数 -> {"w_in": [2d, d]（= [I; 0]）, "b_in": [d], "w1": [d, d], "b1": [d]}（开始时 u = f）。"""
    w_in = np.zeros((2 * d, d), dtype=dtype)
    w_in[:d] = np.eye(d, dtype=dtype)
    return {"w_in": w_in, "b_in": np.zeros(d, dtype=dtype), "w1": np.zeros((d, d), dtype=dtype),
            "b1": np.zeros(d, dtype=dtype)}


def _silu(a):  # -> (SiLU(a), SiLU'(a))
    s = 1.0 / (1.0 + np.exp(-a))
    return a * s, s * (1.0 + a * (1.0 - s))


def _ce(z, labels):  # [B, Vs], [B]（-1 = 不算）-> (平均交叉熵, dL/dz)
    """softmax 交叉熵对有标签的行取平均 -> (loss, dz)。【推导】dL/dz = (softmax(z) − onehot) / 有标签的行数。"""
    ok = labels >= 0
    n = max(int(ok.sum()), 1)
    zm = z - z.max(-1, keepdims=True)
    ez = np.exp(zm)
    s = ez.sum(-1, keepdims=True)
    P = ez / s
    rows = np.flatnonzero(ok)
    loss = float((np.log(s[rows, 0]) - zm[rows, labels[rows]]).sum() / n)
    dz = P
    dz[rows, labels[rows]] -= 1.0
    dz[~ok] = 0.0
    return loss, dz / n


def medusa_loss(params, head, feats, labels):  # {w, b}, [d, Vs], [B, d], [k, B] -> (loss, grads)
    """
    k 个 Medusa 头的损失（每个头的平均交叉熵之和）和梯度 -> (float, {"w", "b"})。

    【推导】a_i = f·W_i + b_i，u_i = f + SiLU(a_i)，z_i = u_i·head；dz_i = (softmax(z_i) − onehot)/n_i，
    du_i = dz_i·headᵀ，da_i = du_i ⊙ SiLU'(a_i)，dW_i = fᵀ·da_i，db_i = Σ_rows da_i。
    【参数】head：冻结的 lm_head（或它的几列，草稿词表）；labels[i] = 第 i + 1 个头的目标 token 在 head 的列里的下标，-1 不算。
    """
    loss, gw, gb = 0.0, np.zeros_like(params["w"]), np.zeros_like(params["b"])
    for i in range(params["w"].shape[0]):
        a = feats @ params["w"][i] + params["b"][i]
        act, dact = _silu(a)
        li, dz = _ce((feats + act) @ head, labels[i])
        da = (dz @ head.T) * dact
        gw[i], gb[i] = feats.T @ da, da.sum(0)
        loss += li
    return loss, {"w": gw, "b": gb}


def eagle_inputs(model, feats, toks):  # [B, d], [B] -> [B, 2d]
    """EAGLE 式草稿的输入 [f, rms_scale(embed(x))]（目标自己的词嵌入和 RMSNorm）。"""
    e = model.rms_scale(model.embed(np.asarray(toks)))
    return np.concatenate([feats, e.astype(feats.dtype)], axis=-1)


def _eagle_forward(params, x):  # [B, 2d] -> (u, a, dact)
    a = x @ params["w_in"] + params["b_in"]
    act, dact = _silu(a @ params["w1"] + params["b1"])
    return a + act, a, dact


def eagle_loss(params, head, x, feats_next, labels, feat_weight=FEAT_WEIGHT):  # -> (loss, grads)
    """
    EAGLE 式草稿的损失 = 交叉熵(lm_head(u), 下一个 token) + feat_weight·平均 ‖u − f_{t+1}‖² 和梯度 -> (float, grads)。

    【推导】a = x·W_in + b_in，c = a·W_1 + b_1，u = a + SiLU(c)，z = u·head；
    du = dz·headᵀ + 2·feat_weight·(u − f_next)/B，dc = du ⊙ SiLU'(c)，dW_1 = aᵀ·dc，db_1 = Σ dc，
    da = du + dc·W_1ᵀ（残差的那一项），dW_in = xᵀ·da，db_in = Σ da。
    【参数】x：eagle_inputs 的 [B, 2d]；feats_next [B, d]；labels [B]（head 的列下标，-1 = 交叉熵不算这一行，回归照算）。
    """
    u, a, dact = _eagle_forward(params, x)
    ce, dz = _ce(u @ head, labels)
    B = x.shape[0]
    diff = u - feats_next
    loss = ce + feat_weight * float((diff * diff).sum() / B)
    du = dz @ head.T + (2.0 * feat_weight / B) * diff
    dc = du * dact
    da = du + dc @ params["w1"].T
    return loss, {"w_in": x.T @ da, "b_in": da.sum(0), "w1": a.T @ dc, "b1": dc.sum(0)}


def train_scale(model):
    """草稿的尺度 s = √d（见模块说明的【尺度】）：训练时输入乘 s、lm_head 除以 s -> float。"""
    return float(np.sqrt(model.cfg.d_model))


# ---------------------------------------------------------------------------
# 训练：Adam
# ---------------------------------------------------------------------------
def adam_step(params, grads, state, lr):
    """Adam 的一步（就地改 params）。state：{"t": 步数, "m": {}, "v": {}}，第一次调用时为空的 dict 也行。"""
    b1, b2, eps = ADAM["beta1"], ADAM["beta2"], ADAM["eps"]
    state["t"] = t = state.get("t", 0) + 1
    m, v = state.setdefault("m", {}), state.setdefault("v", {})
    for name, g in grads.items():
        m[name] = b1 * m.get(name, 0.0) + (1 - b1) * g
        v[name] = b2 * v.get(name, 0.0) + (1 - b2) * g * g
        mh, vh = m[name] / (1 - b1 ** t), v[name] / (1 - b2 ** t)
        params[name] -= (lr * mh / (np.sqrt(vh) + eps)).astype(params[name].dtype)


def train_epochs(params, loss_grad, n_rows, batch, epochs, lr, rng, progress=None):
    """
    小批量 Adam 训练 -> 每个 epoch 的平均损失（更新之前算的）的 list；就地改 params。

    【参数】loss_grad(params, idx) -> (loss, grads)：在第 idx 行（一个小批）上；每个 epoch 用 rng.permutation 打乱一次；
    progress(epoch, 第几批, 共几批)：每批之后调用（进度条）。
    【边界】n_rows、batch、epochs < 1 或 lr ≤ 0：ValueError。
    """
    for name, v in (("n_rows", n_rows), ("batch", batch), ("epochs", epochs)):
        if not (isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1):
            raise ValueError(f"{name} 必须是 ≥ 1 的整数（收到 {v!r}）")
    if not lr > 0:
        raise ValueError(f"学习率 lr 必须为正（收到 {lr!r}）")
    state, out = {}, []
    nb = -(-n_rows // batch)
    for ep in range(epochs):
        order = rng.permutation(n_rows)
        total = 0.0
        for b in range(nb):
            loss, grads = loss_grad(params, order[b * batch:(b + 1) * batch])
            adam_step(params, grads, state, lr)
            total += loss
            if progress is not None:
                progress(ep, b + 1, nb)
        out.append(total / nb)
    return out


# ---------------------------------------------------------------------------
# 草稿：把参数和目标的 lm_head 接在一起
# ---------------------------------------------------------------------------
class DraftHead:
    """
    一个训练好的草稿（kind = "medusa" 或 "eagle"）接在目标 model 上 -> .logits(...) 给整个词表的 logits
    （草稿词表之外是 −inf，q = 0）。

    【参数】params：init_medusa / init_eagle 形状的 dict（任何浮点类型，算时转成 model 的 dtype）；vocab_ids：草稿词表
    （升序的 token id），None = 整个词表。草稿的 lm_head = 目标融合好的 lm_head 的这几列（同一份冻结的权重）。
    """

    def __init__(self, kind, model, params, vocab_ids=None):
        if kind not in ("medusa", "eagle"):
            raise ValueError(f"kind 只能是 'medusa' 或 'eagle'（收到 {kind!r}）")
        dt = np.dtype(model.cfg.dtype)
        self.kind, self.model = kind, model
        self.params = {k: np.asarray(v, dtype=dt) for k, v in params.items()}
        V = model.cfg.vocab
        self.ids = None if vocab_ids is None else np.asarray(vocab_ids, dtype=np.int64)
        if self.ids is not None and (self.ids.size == 0 or self.ids.min() < 0 or self.ids.max() >= V
                                     or np.any(np.diff(self.ids) <= 0)):
            raise ValueError(f"vocab_ids 必须是 0..{V - 1} 里严格递增的 token id，至少一个")
        self.head = model._head if self.ids is None else np.ascontiguousarray(model._head[:, self.ids])
        self.s = train_scale(model)
        self.k = self.params["w"].shape[0] if kind == "medusa" else None

    def _full(self, z):  # [..., Vs] -> [..., V]
        if self.ids is None:
            return z
        out = np.full(z.shape[:-1] + (self.model.cfg.vocab,), -np.inf, dtype=z.dtype)
        out[..., self.ids] = z
        return out

    def medusa_logits(self, f):  # [d] -> [k, V]
        """k 个头在特征 f 上的 logits（第 i 行预测 f 的位置之后第 i + 2 个 token，即已抽出的那个之后第 i + 1 个）。"""
        p, x = self.params, self.s * f
        a = np.einsum("d,kde->ke", x, p["w"]) + p["b"]
        return self._full((x[None, :] + _silu(a)[0]) @ self.head / self.s)

    def eagle_step(self, f, tok):  # [d], int -> (u [d], logits [V])
        """EAGLE 式的一步：(f_t, x_{t+1}) -> (预测的 f_{t+1}, 它的 logits)。"""
        u = _eagle_forward(self.params, self.s * eagle_inputs(self.model, f[None, :], [tok]))[0][0]
        return u / self.s, self._full(u @ self.head / self.s)

    def n_params(self):
        """可训练的参数个数（不含共用的 lm_head）。"""
        return int(sum(v.size for v in self.params.values()))


def draft_params(kind, d, k=1):
    """可训练的参数个数：Medusa k 个头 k·(d² + d)；EAGLE 式 2d² + d + d² + d -> int。"""
    if kind == "medusa":
        return k * (d * d + d)
    if kind == "eagle":
        return 3 * d * d + 2 * d
    raise ValueError(f"kind 只能是 'medusa' 或 'eagle'（收到 {kind!r}）")


def draft_cost(kind, d, n_head_cols, k=1, bytes_per_param=2):
    """
    草稿产出一个草稿 token 的账（batch 1）-> {"params", "flops", "bytes"}：读的参数 = 草稿自己的 + lm_head 的 d × n_head_cols
    （草稿词表的列数）；FLOPs = 2 × 读的参数（每个参数一次乘加）；字节 = 参数 × bytes_per_param（默认 BF16 / FP16）。

    【推导】Medusa 一次前向给 k 个头各一个 token：每个头一个 d × d 块 + 一次 lm_head，所以每个草稿 token 的账是一个头的；
    EAGLE 式每个草稿 token 一步：FC（2d × d）+ 一个 d × d 块 + 一次 lm_head。偏置、SiLU、RMSNorm 不到 1%，不算。
    """
    own = draft_params("medusa", d, 1) if kind == "medusa" else draft_params(kind, d)
    p = own + d * n_head_cols
    return {"params": p, "flops": 2 * p, "bytes": p * bytes_per_param}
