"""
greedy_lab（T = 0 的精确轮次）：在第 3 讲的玩具模型上跑真实的投机解码循环（链、自适应 γ、prompt lookup），
每一轮的起点、接受个数、目标调用次数和从 teacher forcing 的 agree 数出来的完全一样；top-k 树按定义沿贪心路径走
（argsort 排名，不用 token_ranks）；排名的并列规则和 adjust 的 argmax 一致。真实模型（float64）的同一核对在
test_lecture06_10.py。drafts_lab 的真实模型自草稿在玩具上和按 params 新建的模型逐位相同。
"""
import numpy as np
import pytest

from decode_lab import TransformerLM, adjust, autoregressive_generate, speculative_generate  # noqa: E402
from drafts_lab import early_exit_draft, layer_skip_draft, layer_subset, matrix_bytes, requantized_draft  # noqa: E402
from greedy_lab import greedy_rounds, lookup_rounds, round_summary, token_ranks, tree_rounds, tree_size  # noqa: E402
from lookup_lab import PromptLookup, speculative_generate_adaptive  # noqa: E402
from quant_lab import QCFG, quantize_params  # noqa: E402
from transformer_lab import config_like, init_params  # noqa: E402

N_NEW = 48


@pytest.fixture(scope="module")
def toy():
    P = init_params(QCFG, seed=0)
    target = TransformerLM(P, QCFG, "目标")
    return P, target, early_exit_draft(target, 3)


def _text_and_agree(target, draft, prompt):
    new = [int(x) for x in autoregressive_generate(target, prompt, N_NEW, 0.0, np.random.default_rng(0))]
    seq = np.array([prompt + new])
    lq = draft.full_logits(seq)[0, len(prompt) - 1:-1]
    return new, lq.argmax(-1) == np.array(new), lq


def _check_same_rounds(mine, st):
    """真实循环 vs 精确轮次：轮数、除最后一轮以外的接受个数相同；最后一轮循环接受的不少于文本里看得到的。"""
    assert mine["calls"] == st["target_calls"]
    np.testing.assert_array_equal(mine["accepted"][:-1], st["accepted"][:-1])
    assert st["accepted"][-1] >= mine["accepted"][-1]
    starts = np.concatenate([[0], np.cumsum(np.asarray(st["accepted"]) + 1)[:-1]])
    np.testing.assert_array_equal(mine["starts"], starts)


@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_rounds_equal_a_real_speculative_loop(toy, gamma):
    P, target, draft = toy
    prompt = [5, 17, 40, 2]
    new, agree, _ = _text_and_agree(target, draft, prompt)
    out, st = speculative_generate(target, draft, prompt, N_NEW, gamma, 0.0, np.random.default_rng(1))
    np.testing.assert_array_equal(out, new)
    assert 0 < agree.mean() < 1
    _check_same_rounds(greedy_rounds(agree, gamma), st)


def test_adaptive_greedy_rounds_equal_the_adaptive_loop(toy):
    P, target, draft = toy
    prompt = [9, 3, 120]
    new, agree, _ = _text_and_agree(target, draft, prompt)
    out, st = speculative_generate_adaptive(target, draft, prompt, N_NEW, 2, 0.0, np.random.default_rng(2),
                                            gamma_max=9)
    np.testing.assert_array_equal(out, new)
    mine = greedy_rounds(agree, 2, gamma_max=9)
    _check_same_rounds(mine, st)
    np.testing.assert_array_equal(mine["drafted"], st["drafted"])


def test_lookup_rounds_equal_the_prompt_lookup_loop(toy):
    P, target, _ = toy
    rng = np.random.default_rng(5)
    block = [int(x) for x in (rng.random(12) * QCFG.vocab).astype(int)]
    prompt = block + [7] + block + [7] + block[:3]           # 重复的段落：lookup 有东西可抄
    new = [int(x) for x in autoregressive_generate(target, prompt, N_NEW, 0.0, np.random.default_rng(0))]
    for g, gmax in ((4, None), (2, 12)):
        out, st = speculative_generate_adaptive(target, PromptLookup(2), prompt, N_NEW, g, 0.0,
                                                np.random.default_rng(0), gamma_max=gmax)
        np.testing.assert_array_equal(out, new)
        mine = lookup_rounds(prompt, new, PromptLookup(2), g, gmax)
        _check_same_rounds(mine, st)
        np.testing.assert_array_equal(mine["drafted"][:-1], st["drafted"][:-1])


def test_token_ranks_match_argsort_and_the_argmax_tie_rule():
    logits = np.array([[0.0, 2.0, 2.0, 1.0], [3.0, 3.0, 3.0, 3.0], [1.0, 0.0, 5.0, -1.0]])
    toks = np.array([2, 0, 3])
    # 并列：下标小的排前面（adjust 的 T = 0 取下标最小的 argmax）
    np.testing.assert_array_equal(token_ranks(logits, toks), [1, 0, 3])
    assert adjust(logits[1], 0.0)[0] == 1.0
    rng = np.random.default_rng(0)
    L = rng.standard_normal((30, 50))
    t = (rng.random(30) * 50).astype(int)
    order = np.argsort(-L, axis=1, kind="stable")
    want = np.array([int(np.flatnonzero(order[i] == t[i])[0]) for i in range(30)])
    np.testing.assert_array_equal(token_ranks(L, t), want)


def _tree_walk(lq, new, widths):
    """按定义沿贪心路径走：第 i 层接得上 ⇔ 文本的 token 在草稿（真实前缀上）的前 k_i 名里（argsort 的排名）。"""
    order = np.argsort(-lq, axis=1, kind="stable")
    acc, t = [], 0
    while t < len(new):
        r = 0
        while r < len(widths) and t + r < len(new) and new[t + r] in order[t + r, :widths[r]]:
            r += 1
        acc.append(r)
        t += r + 1
    return acc


@pytest.mark.parametrize("widths", [(1, 1, 1), (2, 1), (4,), (3, 2, 1, 1)])
def test_tree_rounds_follow_the_greedy_path_through_top_k(toy, widths):
    P, target, draft = toy
    prompt = [11, 60, 3]
    new, agree, lq = _text_and_agree(target, draft, prompt)
    got = tree_rounds(token_ranks(lq, new), widths)
    np.testing.assert_array_equal(got["accepted"], _tree_walk(lq, new, widths))
    if max(widths) == 1:
        np.testing.assert_array_equal(got["accepted"], greedy_rounds(agree, len(widths))["accepted"])


def test_tree_size_and_round_summary():
    assert tree_size((1, 1, 1, 1)) == 4 and tree_size((2, 1, 1, 1)) == 8 and tree_size((2, 2, 1)) == 10
    assert tree_size((8,)) == 8 and tree_size((3, 3)) == 12
    a = greedy_rounds(np.array([1, 1, 0, 1, 1, 1, 0, 0, 1, 1], dtype=bool), 2)
    # 轮：t=0 接 2（产 3）→ t=3 接 2 → t=6 接 0 → t=7 接 0 → t=8 接 2（只剩 2 个位置：不完整）
    np.testing.assert_array_equal(a["starts"], [0, 3, 6, 7, 8])
    np.testing.assert_array_equal(a["accepted"], [2, 2, 0, 0, 2])
    np.testing.assert_array_equal(a["complete"], [True, True, True, True, False])
    s = round_summary([a])
    assert s["calls"] == 5 and s["tokens"] == 10 and s["per_call"] == pytest.approx((3 + 3 + 1 + 1) / 4)
    with pytest.raises(ValueError, match="宽度"):
        tree_size((2, 0))
    with pytest.raises(ValueError, match="gamma"):
        greedy_rounds(np.ones(4, dtype=bool), 0)
    with pytest.raises(ValueError, match="gamma_max"):
        greedy_rounds(np.ones(4, dtype=bool), 3, gamma_max=2)


def test_layer_subset_drafts_equal_models_built_from_params(toy):
    P, target, _ = toy
    x = (np.random.default_rng(1).random((2, 24)) * QCFG.vocab).astype(int)
    for d, keep in ((layer_skip_draft(target, 1, 2), [0, 3]), (early_exit_draft(target, 2), [0, 1]),
                    (layer_subset(target, [3, 1]), [3, 1])):
        pk = dict(P)
        pk["layers"] = [P["layers"][i] for i in keep]
        ref = TransformerLM(pk, config_like(QCFG, n_layers=len(keep)))
        np.testing.assert_array_equal(d.full_logits(x), ref.full_logits(x))
        assert d.cfg.n_layers == len(keep) and target.cfg.n_layers == QCFG.n_layers
    with pytest.raises(ValueError, match="第一层和最后一层"):
        layer_skip_draft(target, 0, 2)
    with pytest.raises(ValueError, match="k 必须"):
        early_exit_draft(target, 4)
    with pytest.raises(ValueError, match="不重复"):
        layer_subset(target, [1, 1])


def test_requantized_draft_equals_quantize_params_and_bytes_count_scales(toy):
    P, target, _ = toy
    for scheme, head in (("int4-g32", False), ("int8", True)):
        d, rep = requantized_draft(P, QCFG, scheme, include_lm_head=head)
        ref, ref_rep = quantize_params(P, scheme, include_lm_head=head)
        for L, R in zip(d.params["layers"], ref["layers"]):
            for m in R:
                np.testing.assert_array_equal(L[m], R[m])
        np.testing.assert_array_equal(d.params["lm_head"], ref["lm_head"])
        assert rep["bits_per_param"] == pytest.approx(ref_rep["bits_per_param"], rel=1e-15)
        # 字节数按手算：每层 7 个矩阵 × 位数 / 8，lm_head 量化了按它的位数，否则 16 位
        per_layer = QCFG.d_model * (QCFG.n_heads + 2 * QCFG.n_kv_heads) * QCFG.head_dim \
            + QCFG.n_heads * QCFG.head_dim * QCFG.d_model + 3 * QCFG.d_model * QCFG.d_ff
        bits = {"int4-g32": 4 + 16 / 32, "int8": None}[scheme]
        head_n = QCFG.d_model * QCFG.vocab
        if bits is not None:
            want = QCFG.n_layers * per_layer * bits / 8 + head_n * 2
            assert matrix_bytes(P, report=rep) == pytest.approx(want, rel=1e-12)
    assert matrix_bytes(P) == pytest.approx((QCFG.n_layers * per_layer + head_n) * 2, rel=1e-15)
