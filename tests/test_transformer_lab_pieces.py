"""
transformer_lab 拆成零件之后（第 5 讲的引擎调用它们）：forward 仍是同样的运算（逐位相同），每次权重矩阵乘之前的钩子
按顺序被调用、能改输入；零件在任意前导维上和 forward 一致。
"""
import numpy as np

from transformer_lab import LMConfig, NumpyTransformer, init_params

CFG = LMConfig(max_seq=32)
P = init_params(CFG, 7)
TOKS = np.random.default_rng(0).integers(0, CFG.vocab, (2, 9))


def test_identity_hook_leaves_forward_bitwise_unchanged_and_sees_every_matmul():
    m = NumpyTransformer(P, CFG)
    ref = m.forward(TOKS)
    seen = []
    m.matmul_hook = lambda op, li, x: (seen.append((op, li)), x)[1]
    assert np.array_equal(m.forward(TOKS), ref)
    per_layer = [(op, li) for li in range(CFG.n_layers) for op in ("qkv", "o_proj", "gate_up", "down")]
    assert seen == per_layer + [("lm_head", -1)]


def test_hook_changes_the_input_of_its_matmul():
    m = NumpyTransformer(P, CFG)
    ref = m.forward(TOKS)
    m.matmul_hook = lambda op, li, x: x * 0 if op == "lm_head" else x
    assert np.all(m.forward(TOKS) == 0)
    m.matmul_hook = lambda op, li, x: np.round(x, 1) if op == "down" else x     # 一种"激活量化"
    out = m.forward(TOKS)
    assert 1e-6 < np.max(np.abs(out - ref)) < 1.0


def test_pieces_on_a_flat_batch_equal_forward():
    """把两条序列摊成 [N, d] 用零件算一层一层（注意力各算各的），和 forward 的 logits 只差舍入。"""
    m = NumpyTransformer(P, CFG)
    ref = m.forward(TOKS)
    B, n = TOKS.shape
    H, Hkv, hd = CFG.n_heads, CFG.n_kv_heads, CFG.head_dim
    pos = np.tile(np.arange(n), B)
    x = m.embed(TOKS.ravel())
    mask = np.where(np.arange(n)[None, :] > np.arange(n)[:, None], -np.inf, 0.0)
    for li in range(CFG.n_layers):
        qkv = m.qkv_proj(li, m.rms_scale(x))
        qk = m.rope(qkv, m.rope_table(pos))
        v = qkv[:, (H + Hkv) * hd:].reshape(B * n, Hkv, hd)
        a = np.concatenate([m.attention(qk[None, b * n:(b + 1) * n, :H],
                                        qk[b * n:(b + 1) * n, H:].transpose(1, 0, 2)[None],
                                        v[b * n:(b + 1) * n].transpose(1, 0, 2)[None], mask)[0] for b in range(B)])
        x = x + m.o_proj(li, a)
        x = x + m.mlp(li, m.rms_scale(x))
    out = m.lm_head(m.rms_scale(x)).reshape(B, n, -1)
    assert np.max(np.abs(out - ref)) < 1e-12
