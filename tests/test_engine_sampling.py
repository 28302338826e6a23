"""
采样的过滤器（decode_lab.adjust 的 top_p、top_k、min_p）、引擎的 logprobs、出错的一步、停止 token 正好是第 max_tokens 个：

- adjust 在手搭的分布上：每个过滤器单独、并列的规则、三个的顺序（vLLM V1：min_p → top-k → top-p；顺序换了就红）；
  T = 0 时不改变贪心；参数出界是 ValueError；默认值走原来的路（逐位相同）；
- 神谕：float64 下过滤器开着时，引擎里的每个请求 == decode_lab.autoregressive_generate（同样的过滤器、
  default_rng(seed + i)）；投机解码 == speculative_generate（过滤器只作用在 p 上，q 是草稿自己的）；
- logprobs == 从 keep_logits 的行手算的 log-softmax 和 top-k（另一种算法：全排序）；
- 模型在一步里抛异常：这一步的请求报告 "error"、块全部回来，之后的请求照样 == 单独生成；
- 停止 token 正好是第 max_tokens 个 token：finish_reason 是 "stop"（普通的一步和投机的一轮）。
小的随机模型（LMConfig(max_seq=64)）上跑。
"""
import math

import numpy as np
import pytest

import decode_lab
from decode_lab import TransformerLM, adjust, autoregressive_generate, speculative_generate
from drafts_lab import layer_subset
from engine_lab import MAX_LOGPROBS, LLMEngine, top_logprobs
from transformer_lab import LMConfig, init_params, softmax

CFG = LMConfig(max_seq=64, n_layers=3)
PARAMS = init_params(CFG, 1)
MODEL = TransformerLM(PARAMS, CFG)
DRAFT = layer_subset(MODEL, [0, 2], name="跳过第 1 层")
_R = np.random.default_rng(5)
PROMPTS = [[int(t) for t in _R.integers(0, CFG.vocab, size=k)] for k in (5, 23, 9, 17, 30, 2)]
N_NEW = 12
# 每组过滤器都小到真的去掉 token（test_filters_change_what_the_engine_samples 断言它们改变了输出）
FILTERS = [{"top_p": 0.3}, {"top_k": 3}, {"min_p": 0.5}, {"top_p": 0.6, "top_k": 5, "min_p": 0.2}]


def assert_no_leak(eng):
    assert not eng.has_unfinished_requests()
    assert eng.num_free_blocks == eng.num_blocks
    assert sum(eng.bm.pool.ref) == 0
    eng.bm.pool.check()


# ---------------------------------------------------------------------------
# adjust 在手搭的分布上
# ---------------------------------------------------------------------------
P4 = np.array([0.4, 0.3, 0.2, 0.1])
L4 = np.log(P4)


def test_top_k_keeps_the_k_largest_and_every_tie_at_the_kth_value():
    assert np.allclose(adjust(L4, 1.0, top_k=2), [4 / 7, 3 / 7, 0, 0], rtol=0, atol=1e-15)
    tie = np.log([0.4, 0.2, 0.2, 0.2])                    # 第 2 个值有三个并列：全部留下（vLLM：< 第 k 个值才去掉）
    assert np.allclose(adjust(tie, 1.0, top_k=2), [0.4, 0.2, 0.2, 0.2], rtol=0, atol=1e-15)
    for off in (0, -1, 4, 10):                            # 关掉（0 / −1）或 k ≥ V：不过滤
        assert np.array_equal(adjust(L4, 1.0, top_k=off), softmax(L4))


def test_top_p_keeps_the_smallest_prefix_reaching_p_and_breaks_ties_by_smaller_id():
    # 0.4 前面是 0；0.3 前面 0.4 < 0.5 留下；0.2 前面 0.7 ≥ 0.5 去掉
    assert np.allclose(adjust(L4, 1.0, top_p=0.5), [4 / 7, 3 / 7, 0, 0], rtol=0, atol=1e-15)
    assert np.allclose(adjust(L4, 1.0, top_p=0.39), [1, 0, 0, 0], rtol=0, atol=1e-15)  # 0.3 前面 0.4 ≥ 0.39
    half = np.log([0.4, 0.4, 0.2])                        # 前面的和正好等于 top_p（两个相同的 logits：0.5 是精确的）
    assert np.allclose(adjust(half[:2], 1.0, top_p=0.5), [1, 0], rtol=0, atol=1e-15)       # 0.5 ≥ 0.5：去掉
    assert np.allclose(adjust(L4, 1.0, top_p=0.41), [4 / 7, 3 / 7, 0, 0], rtol=0, atol=1e-15)
    tie = np.log([0.2, 0.4, 0.2, 0.2])                   # 0.4 先留下；之后三个 0.2 并列：id 小的（0）先留
    assert np.allclose(adjust(tie, 1.0, top_p=0.5), [1 / 3, 2 / 3, 0, 0], rtol=0, atol=1e-15)
    assert np.array_equal(adjust(L4, 1.0, top_p=1.0), softmax(L4))


def test_min_p_keeps_tokens_at_least_min_p_times_the_largest():
    assert np.allclose(adjust(L4, 1.0, min_p=0.45), [4 / 9, 3 / 9, 2 / 9, 0], rtol=0, atol=1e-15)
    assert np.allclose(adjust(L4, 1.0, min_p=0.6), [4 / 7, 3 / 7, 0, 0], rtol=0, atol=1e-15)
    assert np.allclose(adjust(L4, 1.0, min_p=1.0), [1, 0, 0, 0], rtol=0, atol=1e-15)
    tie = np.log([0.4, 0.2, 0.4])                         # 等于阈值的留下（两个相同的 logits，概率精确相等）
    assert np.allclose(adjust(tie, 1.0, min_p=1.0), [0.5, 0, 0.5], rtol=0, atol=1e-15)


def test_the_filters_run_in_vllm_order_min_p_then_top_k_then_top_p():
    """
    top-p 最后：它的累加在 min_p 和 top-k 去掉的 token 之后、重新归一化的分布上做。下面两对手搭的分布，
    top-p 挪到前面（在原分布上累加）就给出别的结果。min_p 和 top-k 两个之间的先后不改变结果（两个都只去掉 token、
    阈值都相对最大的那个），第三对把这一点记下来。
    """
    # min_p 之后才 top-p：[0.3, 0.3, 0.2, 0.2]、min_p = 0.7 去掉两个 0.2、top_p = 0.5：
    #   对：{0, 1} 归一化成 0.5、0.5，id 1 前面 0.5 ≥ 0.5 去掉 → {0}；错（top-p 在前）：0.3 < 0.5 → {0, 1}
    d = np.log([0.3, 0.3, 0.2, 0.2])
    assert np.allclose(adjust(d, 1.0, top_p=0.5, min_p=0.7), [1, 0, 0, 0], rtol=0, atol=1e-15)
    # top-k 之后才 top-p：[0.3, 0.3, 0.3, 0.1]、top_k = 2（第 2 个值三个并列，全留）、top_p = 0.65：
    #   对：归一化成 1/3 × 3，第 3 个前面 2/3 ≥ 0.65 去掉 → {0, 1}；错（top-p 在前）：第 3 个前面 0.6 < 0.65 → {0, 1, 2}
    d = np.log([0.3, 0.3, 0.3, 0.1])
    assert np.allclose(adjust(d, 1.0, top_p=0.65, top_k=2), [0.5, 0.5, 0, 0], rtol=0, atol=1e-15)
    # min_p 和 top-k：[0.4, 0.3, 0.15, 0.15]、min_p = 0.5、top_k = 3 → {0, 1}，哪个先都一样
    d = np.log([0.4, 0.3, 0.15, 0.15])
    assert np.allclose(adjust(d, 1.0, top_k=3, min_p=0.5), [4 / 7, 3 / 7, 0, 0], rtol=0, atol=1e-15)


def test_filters_see_the_temperature_scaled_distribution():
    """温度在前：T = 2 把 [0.4, 0.3, 0.2, 0.1] 摊平成 ∝ √p（0.632、0.548、0.447、0.316），min_p = 0.45 的阈值
    0.45 × 0.632 = 0.285：四个都留下。T = 1 时阈值 0.18，0.1 去掉。"""
    s = np.sqrt(P4)
    assert np.allclose(adjust(L4, 2.0, min_p=0.45), s / s.sum(), rtol=0, atol=1e-15)
    assert adjust(L4, 1.0, min_p=0.45)[3] == 0.0


def test_filters_batch_rows_independently_and_t0_is_unchanged():
    rows = np.stack([L4, L4[::-1], np.log([0.25, 0.25, 0.25, 0.25])])
    got = adjust(rows, 1.0, top_p=0.5, top_k=3, min_p=0.1)
    for r, g in zip(rows, got):
        assert np.array_equal(g, adjust(r, 1.0, top_p=0.5, top_k=3, min_p=0.1))
    z = np.random.default_rng(0).normal(size=(5, 40))
    for f in FILTERS:
        assert np.array_equal(adjust(z, 0.0, **f), adjust(z, 0.0))


def test_bad_filter_arguments_raise():
    for kw in ({"top_p": 0.0}, {"top_p": 1.5}, {"top_p": -0.1}, {"top_p": float("nan")}, {"top_p": True},
               {"top_k": -2}, {"top_k": 2.0}, {"top_k": True}, {"top_k": None},
               {"min_p": -0.1}, {"min_p": 1.01}, {"min_p": float("nan")}):
        with pytest.raises(ValueError, match=list(kw)[0]):
            adjust(L4, 1.0, **kw)
        with pytest.raises(ValueError, match=list(kw)[0]):
            adjust(L4, 0.0, **kw)                         # T = 0 也照样检查
        eng = LLMEngine(MODEL, CFG, 16, block_size=4)
        with pytest.raises(ValueError, match=list(kw)[0]):
            eng.add_request([1, 2], 3, 1.0, **kw)
        assert not eng.has_unfinished_requests()


# ---------------------------------------------------------------------------
# 引擎 == 单独生成（过滤器开着）
# ---------------------------------------------------------------------------
_SOLO = {}


def _solo(prompt, n, T, seed, **f):
    """单独生成（神谕）-> token 的 list。结果确定，按参数记下：几个测试要同一个请求的单独生成时只算一次。"""
    key = (tuple(prompt), n, T, seed, tuple(sorted(f.items())))
    if key not in _SOLO:
        _SOLO[key] = [int(t) for t in autoregressive_generate(MODEL, prompt, n, T, np.random.default_rng(seed), **f)]
    return list(_SOLO[key])


@pytest.mark.parametrize("f", FILTERS)
def test_engine_with_filters_equals_each_request_alone(f):
    eng = LLMEngine(MODEL, CFG, 18, block_size=4, max_num_batched_tokens=7, max_num_seqs=4, keep_logits=True)
    ids = [eng.add_request(p, N_NEW, 1.0, 3 + i, **f) for i, p in enumerate(PROMPTS)]
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.scheduler.n_preemptions > 0, "块池要小到挤出请求"
    for i, rid in enumerate(ids):
        assert eng.requests[rid].output == _solo(PROMPTS[i], N_NEW, 1.0, 3 + i, **f), f"请求 {i}"
    assert_no_leak(eng)


def test_filters_change_what_the_engine_samples():
    """上面的神谕不是空的：每组过滤器都改变了至少一个请求的输出，而且抽到的每个 token 都在过滤后的分布里。"""
    plain = [_solo(p, N_NEW, 1.0, 3 + i) for i, p in enumerate(PROMPTS)]
    for f in FILTERS:
        eng = LLMEngine(MODEL, CFG, 64, block_size=4, keep_logits=True)
        outs = eng.generate(PROMPTS, N_NEW, 1.0, seed=3, **f)
        assert outs != plain, f
        for i, rid in enumerate(range(len(PROMPTS))):
            for row, t in zip(eng.requests[rid].logits, outs[i]):
                assert adjust(row, 1.0, **f)[t] > 0
        removed = [int((adjust(row, 1.0, **f) == 0).sum()) for r in eng.requests for row in r.logits]
        assert min(removed) > 0, f"{f}：每一步都要去掉一些 token"


def test_speculative_engine_with_filters_equals_speculative_generate():
    spec = {"method": "draft", "draft_model": DRAFT, "num_speculative_tokens": 3}
    for f in FILTERS[::3]:
        eng = LLMEngine(MODEL, CFG, 64, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                        speculative_config=spec)
        ids = [eng.add_request(p, N_NEW, 1.0, 3 + i, **f) for i, p in enumerate(PROMPTS[:4])]
        while eng.has_unfinished_requests():
            eng.step()
        for i, rid in enumerate(ids):
            want, st = speculative_generate(MODEL, DRAFT, PROMPTS[i], N_NEW, 3, 1.0, np.random.default_rng(3 + i), **f)
            assert eng.requests[rid].output == [int(t) for t in want], f"请求 {i}"
            assert eng.requests[rid].accepted == st["accepted"]
        assert_no_leak(eng)


def test_speculative_filters_shape_p_only_not_q():
    """
    草稿 = 目标自己、T = 1、top_k = 2：q 没过滤（目标的整个分布），p 过滤过，所以草稿有时抽到 p 里去掉的 token、
    被拒绝。若 q 也被过滤（错：q 不再是草稿真正抽样的分布——这里草稿就按过滤过的分布抽，p == q），每轮都全部接受。
    另外断言：输出的每个 token 都在过滤过的 p 里。
    """
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, speculative_config={"method": "draft", "draft_model": MODEL,
                                                                       "num_speculative_tokens": 3}, keep_logits=True)
    outs = eng.generate(PROMPTS[:3], N_NEW, 1.0, seed=3, top_k=2)
    acc = [n for r in eng.requests for n in r.accepted]
    assert min(acc) < 3
    for r, out in zip(eng.requests, outs):
        for row, t in zip(r.logits, out):
            assert adjust(row, 1.0, top_k=2)[t] > 0


# ---------------------------------------------------------------------------
# logprobs
# ---------------------------------------------------------------------------
def _hand_logprobs(row, tok, k):
    """另一种算法：log(Σ exp) 用 math.fsum 在 Python 的 float 上累加；top-k 用整个词表的全排序。"""
    row = [float(x) for x in row]
    m = max(row)
    lse = m + math.log(math.fsum(math.exp(x - m) for x in row))
    lp = [x - lse for x in row]
    order = sorted(range(len(lp)), key=lambda i: (-lp[i], i))
    return lp[tok], [(i, lp[i]) for i in order[:k]]


def _check_logprobs(req, k):
    assert len(req.logprobs) == len(req.output) == len(req.logits)
    for (chosen, top), row, tok in zip(req.logprobs, req.logits, req.output):
        want_c, want_top = _hand_logprobs(row, tok, k)
        # 两种算法差在 log Σ exp 的舍入：几个 ulp，1e-12 留足（logits ~ 1、V = 64）
        assert abs(chosen - want_c) < 1e-12
        assert [i for i, _ in top] == [i for i, _ in want_top]
        assert max([abs(a - b) for (_, a), (_, b) in zip(top, want_top)], default=0.0) < 1e-12
        assert all(isinstance(i, int) and isinstance(v, float) for i, v in top)


@pytest.mark.parametrize("k", [0, 1, 5, MAX_LOGPROBS])
def test_logprobs_equal_a_hand_computation_from_the_sampled_rows(k):
    eng = LLMEngine(MODEL, CFG, 18, block_size=4, max_num_batched_tokens=7, max_num_seqs=4, keep_logits=True)
    ids = [eng.add_request(p, 6, T, 3 + i, logprobs=k, top_p=0.5 if T else 1.0)
           for i, (p, T) in enumerate(zip(PROMPTS, [0.0, 1.0] * 3))]
    plain = eng.add_request(PROMPTS[0], 4, 1.0, 0)           # 没要 logprobs 的请求：不记
    while eng.has_unfinished_requests():
        eng.step()
    for rid in ids:
        _check_logprobs(eng.requests[rid], k)
    assert eng.requests[plain].logprobs is None
    assert_no_leak(eng)


def test_logprobs_in_the_speculative_engine_use_the_target_row_of_each_kept_token():
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, keep_logits=True,
                    speculative_config={"method": "draft", "draft_model": DRAFT, "num_speculative_tokens": 3})
    ids = [eng.add_request(p, 9, 1.0, 3 + i, logprobs=3, stop=[5]) for i, p in enumerate(PROMPTS[:4])]
    while eng.has_unfinished_requests():
        eng.step()
    assert max(n for rid in ids for n in eng.requests[rid].accepted) >= 1     # 一轮留下了几个 token
    for rid in ids:
        _check_logprobs(eng.requests[rid], 3)


def test_top_logprobs_breaks_ties_by_smaller_id_and_caps_at_the_vocabulary():
    row = np.array([1.0, 3.0, 3.0, 2.0, 3.0])
    lse = math.log(3 * math.exp(3.0) + math.exp(2.0) + math.exp(1.0))
    c, top = top_logprobs(row, 3, 4)
    assert [i for i, _ in top] == [1, 2, 4, 3]
    assert abs(c - (2.0 - lse)) < 1e-15 and abs(top[0][1] - (3.0 - lse)) < 1e-15
    assert [i for i, _ in top_logprobs(row, 0, 2)[1]] == [1, 2]
    assert [i for i, _ in top_logprobs(row, 0, 9)[1]] == [1, 2, 4, 3, 0]
    assert top_logprobs(row, 0, 0)[1] == []
    big = np.array([0.0, -1e4, -1e4 - 1])                 # 原始 logits 差得很远：logprob 有限（不是 log 0）
    assert np.isfinite(top_logprobs(big, 2, 3)[0])


def test_bad_logprobs_raise():
    eng = LLMEngine(MODEL, CFG, 16, block_size=4)
    for bad in (-1, MAX_LOGPROBS + 1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="logprobs"):
            eng.add_request([1, 2], 3, logprobs=bad)
    rep = LLMEngine.replay({0: [1, 2, 3]}, CFG, 16, block_size=4)
    with pytest.raises(ValueError, match="logprobs"):
        rep.add_request([1, 2], 3, logprobs=1)


# ---------------------------------------------------------------------------
# 出错的一步
# ---------------------------------------------------------------------------
def test_a_failing_step_reports_error_frees_blocks_and_the_engine_keeps_serving():
    eng = LLMEngine(MODEL, CFG, 24, block_size=4, max_num_batched_tokens=16, max_num_seqs=3)
    real, calls = eng.runner.run, []

    def flaky(chunks):
        calls.append(len(calls))
        if len(calls) == 3:
            raise RuntimeError("injected fault")
        return real(chunks)

    eng.runner.run = flaky
    ids = [eng.add_request(p, 8, 1.0, 3 + i) for i, p in enumerate(PROMPTS[:4])]
    seen = {}
    for _ in range(3):
        for rid, toks, reason in eng.step():
            seen.setdefault(rid, []).append((toks, reason))
    failed = [rid for rid, ev in seen.items() if ev[-1] == ([], "error")]
    assert failed, "第 3 步的请求报告 error"
    for rid in failed:
        r = eng.requests[rid]
        assert r.finish_reason == "error" and "error" in r.error and "出错" in r.error
        assert not r.block_table
    assert isinstance(eng.last_error, RuntimeError)
    eng.abort_request(failed[0])                              # 已经结束的：什么都不做
    while eng.has_unfinished_requests():
        for rid, toks, reason in eng.step():
            assert rid not in failed
    for rid in failed:
        eng.release(rid)                                      # 结束已经报告过：可以 release
    assert_no_leak(eng)
    # 之后来的请求照样 == 单独生成（块池里出错那一步写过的块不影响它们：前缀缓存开着）
    later = [eng.add_request(p, 8, 1.0, 3 + i) for i, p in enumerate(PROMPTS[:4])]
    while eng.has_unfinished_requests():
        eng.step()
    for i, rid in enumerate(later):
        assert eng.requests[rid].output == _solo(PROMPTS[i], 8, 1.0, 3 + i)
    assert_no_leak(eng)


def test_a_failing_speculative_step_frees_blocks_too():
    eng = LLMEngine(MODEL, CFG, 64, block_size=4,
                    speculative_config={"method": "draft", "draft_model": DRAFT, "num_speculative_tokens": 3})
    real = eng.runner.target.forward
    state = {"n": 0}

    def flaky(pieces):
        state["n"] += 1
        if state["n"] == 2:
            raise FloatingPointError("injected")
        return real(pieces)

    eng.runner.target.forward = flaky
    ids = [eng.add_request(p, 8, 1.0, 3 + i) for i, p in enumerate(PROMPTS[:3])]
    reasons = {}
    while eng.has_unfinished_requests():
        for rid, toks, reason in eng.step():
            reasons[rid] = reason
    assert set(reasons.values()) == {"error"}
    assert all(eng.requests[i].error for i in ids)
    assert_no_leak(eng)


# ---------------------------------------------------------------------------
# 停止 token 正好是第 max_tokens 个
# ---------------------------------------------------------------------------
def test_a_stop_token_that_is_exactly_the_max_tokens_th_token_finishes_with_stop():
    """
    回归：postprocess 先查长度、再查停止 token 时，这里报 "length"，serve.py 就把停止 token 放进文字里
    （stop_token_ids 落在第 max_tokens 个 token 上）。普通的一步和投机的一轮（停止 token 在被接受的一段的末尾）都查。
    """
    for T in (0.0, 1.0):
        for i, p in enumerate(PROMPTS[:3]):
            out = _solo(p, 6, T, 3 + i)
            for n in (1, 3, 6):
                stop = out[n - 1]
                if stop in out[:n - 1]:
                    continue
                eng = LLMEngine(MODEL, CFG, 32, block_size=4)
                rid = eng.add_request(p, n, T, 3 + i, stop=stop)
                events = []
                while eng.has_unfinished_requests():
                    events += eng.step()
                assert eng.requests[rid].output == out[:n]
                assert events[-1][2] == "stop" and eng.requests[rid].finish_reason == "stop", (T, i, n)
    # 投机：T = 0、草稿 = 目标自己（每轮全部接受），max_tokens 落在一轮的中间和末尾
    spec = {"method": "draft", "draft_model": MODEL, "num_speculative_tokens": 3}
    out = _solo(PROMPTS[0], 9, 0.0, 0)
    for n in (2, 4, 5, 8):
        if out[n - 1] in out[:n - 1]:
            continue
        eng = LLMEngine(MODEL, CFG, 32, block_size=4, speculative_config=spec)
        rid = eng.add_request(PROMPTS[0], n, 0.0, 0, stop=out[n - 1])
        while eng.has_unfinished_requests():
            eng.step()
        assert eng.requests[rid].output == out[:n]
        assert eng.requests[rid].finish_reason == "stop", n


def test_decode_lab_generators_share_the_filters():
    """sample_from_prompts 和 speculative_generate 也收这三个参数：过滤器去掉的 token 抽不到。"""
    outs = decode_lab.sample_from_prompts(MODEL, PROMPTS[:2], 3, 6, 1.0, np.random.default_rng(0), top_k=1)
    for p, o in zip([PROMPTS[0]] * 3 + [PROMPTS[1]] * 3, outs):
        assert [int(t) for t in o] == _solo(p, 6, 0.0, 0)      # top_k = 1 就是贪心
    got, _ = speculative_generate(MODEL, DRAFT, PROMPTS[0], 6, 2, 1.0, np.random.default_rng(0), top_k=1)
    assert [int(t) for t in got] == _solo(PROMPTS[0], 6, 0.0, 0)


def test_greedy_fast_path_takes_the_first_argmax_and_draws_one_uniform_like_sampling():
    """runner_lab.ModelRunner.run 在 T = 0 时直接取 argmax（不建 adjust 的 one-hot）：并列时取下标最小的，和
    adjust + sample_inverse_cdf 一样；每个抽样位置照样从请求的生成器取一个均匀数（导出的 rng_state 和单独生成时一样）。"""
    eng = LLMEngine(MODEL, CFG, 18, block_size=4, max_num_seqs=4)
    rows = np.zeros((2, CFG.vocab))
    rows[0, [7, 3]] = 5.0                                  # 并列：应取 3
    rows[1, [CFG.vocab - 1, 11]] = [2.0, 1.5]              # 最大的在最后一个下标
    eng.runner.forward = lambda chunks: rows[:len(chunks)].copy()
    ids = [eng.add_request(p, 2, 0.0, 40 + i) for i, p in enumerate(PROMPTS[:2])]
    out = dict((rid, new) for rid, new, _ in eng.step())
    for i, (rid, want) in enumerate(zip(ids, (3, CFG.vocab - 1))):
        slow = int(decode_lab.sample_inverse_cdf(adjust(rows[i], 0.0), 0.999))
        assert out[rid] == [want] == [slow]
        ref = np.random.default_rng(40 + i)
        ref.random()
        assert eng.requests[rid].rng.bit_generator.state == ref.bit_generator.state


def test_sampling_split_across_threads_draws_exactly_what_one_thread_draws():
    """sample_threads=2：一步里 ≥ runner_lab.SAMPLE_SPLIT_MIN_ROWS 行时两个线程各抽一半；每个请求的输出和一个线程时、
    和它单独生成时都相同（T = 1，float64），生成器的状态也相同。"""
    import runner_lab
    R = np.random.default_rng(9)
    prompts = [[int(t) for t in R.integers(0, CFG.vocab, size=k)] for k in range(3, 3 + 10)]
    runs = []
    for threads in (1, 2):
        eng = LLMEngine(MODEL, CFG, 64, block_size=4, max_num_batched_tokens=256, max_num_seqs=10,
                        sample_threads=threads)
        ids = [eng.add_request(p, 5, 1.0, 60 + i) for i, p in enumerate(prompts)]
        for _ in range(50):                              # 有界：10 个请求各 5 个 token，远用不了 50 步
            if not eng.has_unfinished_requests():
                break
            eng.step()
        assert not eng.has_unfinished_requests()
        assert max(s["decodes"] for s in eng.steps) >= runner_lab.SAMPLE_SPLIT_MIN_ROWS, "要真的分线程"
        runs.append([(eng.requests[r].output, eng.requests[r].rng.bit_generator.state) for r in ids])
        assert_no_leak(eng)
    assert runs[0] == runs[1]
    for i, p in enumerate(prompts):
        assert runs[1][i][0] == _solo(p, 5, 1.0, 60 + i), f"请求 {i}"


def test_a_failing_threaded_sample_fails_the_step_cleanly(monkeypatch):
    import runner_lab

    def boom(row, req, bufs=None):
        raise RuntimeError("抽样坏了")
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, max_num_seqs=10, sample_threads=2)
    ids = [eng.add_request(p, 3, 1.0, i) for i, p in enumerate([[1, 2, 3]] * 10)]
    monkeypatch.setattr(runner_lab, "sample_row", boom)
    out = eng.step()
    assert sorted(r for r, _, f in out if f == "error") == sorted(ids)
    assert isinstance(eng.last_error, RuntimeError)
    assert_no_leak(eng)
    with pytest.raises(ValueError, match="sample_threads"):
        LLMEngine(MODEL, CFG, 64, block_size=4, sample_threads=0)


def test_buffered_sampling_is_bit_for_bit_the_adjust_path(monkeypatch):
    """runner_lab.sample_row 给了缓冲时就地算：和 sample_inverse_cdf(adjust(row, T), u) 逐位相同——随机的行、
    float32 和 float64、T = 1（不除）和别的温度、u 贴着 CDF 的台阶（u·总和 正好落在一个累积和上：side="right" 的规则）
    和贴着 1。过滤器开着时走 adjust 的路。"""
    import runner_lab

    class Req:
        def __init__(self, u, T, **filters):
            self.rng = type("R", (), {"random": lambda s: u})()
            self.temperature = T
            self.filters = dict(runner_lab._NO_FILTER, **filters)

    R = np.random.default_rng(11)
    V = 257
    bufs = (np.empty(V), np.empty(V))
    n = 0
    for dtype in (np.float32, np.float64):
        for T in (1.0, 1, 0.7, 1.9, 1e-3):
            for _ in range(40):
                row = (R.standard_normal(V) * R.choice([0.5, 3.0, 30.0])).astype(dtype)
                p = adjust(row, T)
                c = np.cumsum(p)
                us = [R.random(), 0.0, np.nextafter(1.0, 0.0), c[V // 2] / c[-1]]
                for u in us:
                    want = int(decode_lab.sample_inverse_cdf(p, u))
                    assert runner_lab.sample_row(row, Req(u, T), bufs) == want, (dtype, T, u)
                    n += 1
    assert n == 2 * 5 * 40 * 4
    # 过滤器开着：不碰缓冲，走 adjust（把缓冲换成不能写的数组，走了就地的路会抛错）
    ro = np.zeros(V)
    ro.flags.writeable = False
    row = R.standard_normal(V)
    want = int(decode_lab.sample_inverse_cdf(adjust(row, 1.0, top_k=3), 0.5))
    assert runner_lab.sample_row(row, Req(0.5, 1.0, top_k=3), (ro, ro)) == want
    # 没有过滤器时真的走就地的路（adjust 不被调用）
    monkeypatch.setattr(runner_lab, "adjust", lambda *a, **k: (_ for _ in ()).throw(AssertionError("走了 adjust")))
    assert runner_lab.sample_row(row, Req(0.5, 1.0), bufs) == int(decode_lab.sample_inverse_cdf(softmax(row), 0.5))
