"""
ngram_lab（稀疏的 n 元语法草稿）：add-k 的二元语法和 decode_lab.NGramLM 的稠密表逐格相同；Witten–Bell 和按定义逐格
手算的稠密表相同、每个分布和为 1；会话逐个喂 == 一次算完；能当 speculative_generate 的草稿、alphas_on_text 接受它。
"""
import itertools

import numpy as np
import pytest

from decode_lab import NGramLM, TransformerLM, alphas_on_text, autoregressive_generate, speculative_generate  # noqa: E402
from ngram_lab import SparseNGramLM  # noqa: E402
from transformer_lab import LMConfig, init_params  # noqa: E402

V = 7
SEQS = [[0, 1, 2, 1, 2, 3, 1, 2, 1], [4, 1, 2, 5, 5, 1], [2, 2, 2, 6]]


def test_add_k_bigram_equals_dense_ngramlm_table():
    """add-k：P(b | a) = (c(a, b) + k) / (c(a) + kV)，和 NGramLM.fit 的稠密表逐格相同（同长的序列才能喂给 NGramLM）。"""
    rng = np.random.default_rng(0)
    toks = (rng.random((5, 30)) * V).astype(np.int64)
    dense = NGramLM.fit(toks, V, k=0.3)
    sparse = SparseNGramLM.fit(list(toks), V, order=2, smoothing="add-k", k=0.3)
    probe = (rng.random((2, 20)) * V).astype(np.int64)
    np.testing.assert_allclose(sparse.full_logits(probe), dense.table[probe], rtol=0, atol=1e-12)


def _wb_dense(seqs, vocab, order, k):
    """按 Witten–Bell 的定义逐格手算（不用被测的代码）：{上下文元组: [V] 概率}，上下文长 0..order−1。"""
    flat = [t for s in seqs for t in s]
    uni = np.array([(flat.count(b) + k) / (len(flat) + k * vocab) for b in range(vocab)])
    table = {(): uni}
    for m in range(1, order):
        for h in itertools.product(range(vocab), repeat=m):
            c = np.zeros(vocab)
            for s in seqs:
                for t in range(m, len(s)):
                    if tuple(s[t - m:t]) == h:
                        c[s[t]] += 1
            lower = table[h[1:]]
            tot, u = c.sum(), np.count_nonzero(c)
            table[h] = lower if tot == 0 else np.array([(c[b] + u * lower[b]) / (tot + u) for b in range(vocab)])
    return table


@pytest.mark.parametrize("order", [2, 3])
def test_witten_bell_equals_hand_built_dense_table_and_sums_to_one(order):
    lm = SparseNGramLM.fit(SEQS, V, order=order, k=0.5)
    dense = _wb_dense(SEQS, V, order, 0.5)
    for h, p in dense.items():
        if len(h) == order - 1 or len(h) == 0:
            got = lm.probs_after(list(h))
            np.testing.assert_allclose(got, p, rtol=0, atol=1e-14)
            assert abs(got.sum() - 1.0) < 1e-12
    # 任意上下文（包括没见过的、比 order − 1 长的）的分布都和为 1
    for ctx in ([6, 6, 6], [1, 2], [3], []):
        assert abs(lm.probs_after(ctx).sum() - 1.0) < 1e-12


def test_trigram_uses_the_last_two_tokens_and_backs_off_when_unseen():
    lm = SparseNGramLM.fit(SEQS, V, order=3, k=0.5)
    dense = _wb_dense(SEQS, V, 3, 0.5)
    np.testing.assert_allclose(lm.probs_after([5, 5, 1, 2]), dense[(1, 2)], atol=1e-14)
    np.testing.assert_allclose(lm.probs_after([6, 0]), dense[(0,)], atol=1e-14)     # (6, 0) 没见过：退回 (0,)
    np.testing.assert_allclose(lm.probs_after([5, 6]), dense[()], atol=1e-14)       # 6 后面从没跟过 token：一元
    np.testing.assert_allclose(lm.probs_after([2]), dense[(2,)], atol=1e-14)          # 序列开头：只有一个 token


def test_full_logits_rows_use_the_prefix_and_session_matches():
    lm = SparseNGramLM.fit(SEQS, V, order=3, k=0.5)
    seq = [1, 2, 1, 2, 6, 0]
    full = lm.full_logits([seq])[0]
    for t in range(len(seq)):
        np.testing.assert_allclose(full[t], np.log(lm.probs_after(seq[max(0, t - 1):t + 1])), atol=1e-14)
    s = lm.session()
    a = s.logits(seq[:3])
    b = s.logits(seq)
    np.testing.assert_allclose(np.concatenate([a, b]), full, atol=1e-14)
    s.truncate(2)
    np.testing.assert_allclose(s.logits(seq[:4]), full[2:4], atol=1e-14)
    with pytest.raises(ValueError, match="没有新的 token"):
        s.logits(seq[:4])


def _toy_target():
    cfg = LMConfig(name="t", vocab=V, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, d_ff=32, max_seq=64)
    return TransformerLM(init_params(cfg, seed=3), cfg, "目标")


def test_sparse_ngram_is_a_draft_for_speculative_decoding_and_alphas_on_text():
    target = _toy_target()
    lm = SparseNGramLM.fit(SEQS, V, order=3, k=0.5)
    prompt = [1, 2, 3]
    greedy = autoregressive_generate(target, prompt, 20, 0.0, np.random.default_rng(0))
    out, st = speculative_generate(target, lm, prompt, 20, 3, 0.0, np.random.default_rng(0))
    np.testing.assert_array_equal(out, greedy)
    assert st["target_calls"] >= 20 / 4
    toks = np.array([prompt + [int(x) for x in greedy]])
    got = alphas_on_text(target, {"ng": lm}, toks, (0.0, 1.0))["ng"]
    p = target.full_logits(toks)[0]
    q = np.stack([np.log(lm.probs_after(toks[0, max(0, t - 1):t + 1])) for t in range(toks.shape[1])])
    a0 = float(np.mean(p.argmax(-1) == q.argmax(-1)))
    ps = np.exp(p - p.max(-1, keepdims=True))
    ps /= ps.sum(-1, keepdims=True)
    a1 = float(np.minimum(ps, np.exp(q)).sum(-1).mean())
    assert got[0] == pytest.approx(a0, abs=1e-12) and got[1] == pytest.approx(a1, abs=1e-12)


def test_bad_arguments_raise_value_error():
    with pytest.raises(ValueError, match="order"):
        SparseNGramLM.fit(SEQS, V, order=0)
    with pytest.raises(ValueError, match="平滑方式"):
        SparseNGramLM.fit(SEQS, V, smoothing="kneser-ney")
    with pytest.raises(ValueError, match="add-k"):
        SparseNGramLM.fit(SEQS, V, order=3, smoothing="add-k")
    with pytest.raises(ValueError, match="k 必须为正"):
        SparseNGramLM.fit(SEQS, V, k=0)
    with pytest.raises(ValueError, match="0..6"):
        SparseNGramLM.fit([[1, 7]], V)
    with pytest.raises(ValueError, match="没有训练 token"):
        SparseNGramLM.fit([[]], V)
