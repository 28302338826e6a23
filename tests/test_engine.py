"""
第 5 讲的引擎（engine_lab、scheduler_lab、runner_lab、block_manager_lab）：

- 神谕：float64 下，引擎里每个请求的 token 等于它单独用 decode_lab.autoregressive_generate、同一个种子生成的，
  logits 差 < 1e-12——任意到达顺序、预算小到每步 1 个 token、块池小到要挤出、前缀缓存开和关、T = 0 和 T = 1；
- 不漏块：所有请求结束或中止之后，每一块都空闲、每个引用计数为 0；
- 坏输入：ValueError。
小的随机模型（LMConfig(max_seq=64)）上跑；真实模型一次（SmolLM2 的前 2 层，float64）。
"""
import itertools

import numpy as np
import pytest

from smollm2_models import smollm2_lm
from decode_lab import TransformerLM, autoregressive_generate
from drafts_lab import layer_subset
from engine_lab import LLMEngine, run_trace
from lm_rows import rows_read
from transformer_lab import LMConfig, init_params

CFG = LMConfig(max_seq=64)
PARAMS = init_params(CFG, 1)
MODEL = TransformerLM(PARAMS, CFG)
_R = np.random.default_rng(5)
PROMPTS = [[int(t) for t in _R.integers(0, CFG.vocab, size=k)] for k in (5, 23, 9, 17, 30, 2)]
N_NEW = 16
_SOLO = {}


def solo(prompt, n, T, seed, stop=None):
    """单独生成（神谕）：decode_lab 的自回归生成，自己一个 KV cache。"""
    key = (tuple(prompt), n, T, seed, stop)
    if key not in _SOLO:
        _SOLO[key] = [int(t) for t in autoregressive_generate(MODEL, prompt, n, T, np.random.default_rng(seed),
                                                              stop=stop)]
    return _SOLO[key]


def solo_logits(prompt, out):
    """单独一次前向算出的、抽每个输出 token 时的 logits [len(out), V]。"""
    seq = list(prompt) + list(out)
    return MODEL.full_logits([seq[:-1]])[0, len(prompt) - 1:]


def assert_no_leak(eng):
    assert not eng.has_unfinished_requests()
    assert eng.num_free_blocks == eng.num_blocks
    assert sum(eng.bm.pool.ref) == 0
    eng.bm.pool.check()


def check_oracle(eng, prompts, T, seed, order=None):
    order = list(range(len(prompts))) if order is None else order
    ids = {}
    for i in order:
        ids[i] = eng.add_request(prompts[i], N_NEW, T, seed + i)
    while eng.has_unfinished_requests():
        eng.step()
    for i, rid in ids.items():
        req = eng.requests[rid]
        want = solo(prompts[i], N_NEW, T, seed + i)
        assert req.output == want, f"请求 {i}"
        got = np.array(req.logits)
        ref = solo_logits(prompts[i], want)
        assert np.max(np.abs(got - ref)) < 1e-12 * max(1.0, np.max(np.abs(ref)))
    assert_no_leak(eng)


@pytest.mark.parametrize("T", [0.0, 1.0])
@pytest.mark.parametrize("budget,num_blocks,caching", [(256, 64, True), (1, 16, True), (7, 16, False), (3, 16, True)])
def test_engine_equals_each_request_alone(T, budget, num_blocks, caching):
    eng = LLMEngine(PARAMS, CFG, num_blocks, block_size=4, max_num_batched_tokens=budget, max_num_seqs=4,
                    enable_prefix_caching=caching, keep_logits=True)
    check_oracle(eng, PROMPTS, T, seed=3)
    if num_blocks == 16 and budget > 1:
        assert eng.scheduler.n_preemptions > 0, "块池要小到挤出请求"


@pytest.mark.parametrize("order", [p for k, p in enumerate(itertools.permutations(range(4))) if k % 7 == 0])
def test_any_arrival_order(order):
    eng = LLMEngine(PARAMS, CFG, 20, block_size=4, max_num_batched_tokens=9, max_num_seqs=3, keep_logits=True)
    check_oracle(eng, PROMPTS[:4], 1.0, seed=11, order=list(order))


def test_requests_arriving_between_steps_and_shared_prefixes():
    """请求陆续到达；一半的请求共用一段 12 个 token 的开头（前缀缓存命中），照样等于单独生成。"""
    shared = PROMPTS[4][:12]
    prompts = [shared + p[:5] if i % 2 else p for i, p in enumerate(PROMPTS)]
    eng = LLMEngine(PARAMS, CFG, 24, block_size=4, max_num_batched_tokens=10, max_num_seqs=4, keep_logits=True)
    trace = [(0.004 * i, p, N_NEW, {"temperature": 1.0, "seed": 20 + i}) for i, p in enumerate(prompts)]
    ids = run_trace(eng, trace)
    for i, rid in enumerate(ids):
        assert eng.requests[rid].output == solo(prompts[i], N_NEW, 1.0, 20 + i)
    assert eng.bm.hits > 0
    assert_no_leak(eng)


def test_generate_seeds_request_i_with_seed_plus_i_and_stop():
    eng = LLMEngine(PARAMS, CFG, 32, block_size=4)
    ref = [solo(p, N_NEW, 1.0, 7 + i) for i, p in enumerate(PROMPTS)]
    stop = ref[1][5]
    out = eng.generate(PROMPTS, N_NEW, temperature=1.0, seed=7, stop=stop)
    for i, p in enumerate(PROMPTS):
        assert out[i] == solo(p, N_NEW, 1.0, 7 + i, stop)
    assert out[1][-1] == stop and len(out[1]) <= 6
    reasons = {eng.requests[i].finish_reason for i in range(len(PROMPTS))}
    assert "stop" in reasons
    assert_no_leak(eng)


def test_max_tokens_per_prompt_and_finish_reasons():
    eng = LLMEngine(PARAMS, CFG, 32, block_size=4)
    out = eng.generate(PROMPTS[:3], [1, 4, 9])
    assert [len(o) for o in out] == [1, 4, 9]
    assert [eng.requests[i].finish_reason for i in range(3)] == ["length"] * 3


def test_abort_frees_blocks_and_is_reported():
    eng = LLMEngine(PARAMS, CFG, 32, block_size=4, max_num_batched_tokens=8)
    a = eng.add_request(PROMPTS[1], N_NEW)
    b = eng.add_request(PROMPTS[2], N_NEW)
    c = eng.add_request(PROMPTS[4], N_NEW)
    eng.step()
    eng.step()
    eng.abort_request(a)        # 运行中
    eng.abort_request(c)        # 可能还在等
    out = eng.step()
    assert (a, [], "abort") in out and (c, [], "abort") in out
    while eng.has_unfinished_requests():
        eng.step()
    eng.abort_request(b)        # 已经结束：什么都不做
    assert eng.requests[b].finish_reason == "length"
    assert eng.requests[b].output == solo(PROMPTS[2], N_NEW, 0.0, 0)
    assert_no_leak(eng)
    with pytest.raises(ValueError, match="没有这个请求"):
        eng.abort_request(3)


def test_a_step_loop_receives_the_abort_of_the_last_request():
    """回归：中止最后一个（或唯一的）请求后 has_unfinished_requests() 曾是 False，while 它: step() 的循环收不到
    (id, [], "abort")（serve.py 只好自己收尾）。"""
    for n_steps_before in (0, 2):                       # 还在等时中止；prefill / decode 中途中止
        eng = LLMEngine(PARAMS, CFG, 32, block_size=4, max_num_batched_tokens=8)
        rid = eng.add_request(PROMPTS[1], N_NEW)
        for _ in range(n_steps_before):
            eng.step()
        eng.abort_request(rid)
        assert eng.has_unfinished_requests()
        events = []
        while eng.has_unfinished_requests():
            events += eng.step()
        assert events == [(rid, [], "abort")]
        assert eng.step() == []                          # 只报告一次
        assert_no_leak(eng)


def test_release_and_max_step_history_bound_what_the_engine_keeps():
    eng = LLMEngine(PARAMS, CFG, 32, block_size=4, max_num_batched_tokens=8, max_step_history=3)
    ids = [eng.add_request(p, 4) for p in PROMPTS[:3]]
    eng.step()
    eng.abort_request(ids[2])
    with pytest.raises(ValueError, match="还没结束"):
        eng.release(ids[0])                              # 还在跑
    with pytest.raises(ValueError, match="还没结束"):
        eng.release(ids[2])                              # 中止了，但还没报告
    n = 1
    finished = []
    while eng.has_unfinished_requests():
        for rid, _, why in eng.step():
            if why is not None:
                finished.append(rid)
                eng.release(rid)
        n += 1
    assert sorted(finished) == ids
    assert n > 3 and len(eng.steps) == 3                 # 只留最近 3 步
    assert len(eng.requests) == 0 and list(eng.requests) == [] and eng.requests[0:3] == []
    with pytest.raises(KeyError):
        eng.requests[ids[0]]
    eng.release(ids[0])                                  # 已经 release 过：什么都不做
    eng.abort_request(ids[1])                            # 同上
    with pytest.raises(ValueError, match="没有这个请求"):
        eng.release(3)
    rid = eng.add_request(PROMPTS[0], 2)                 # id 继续往后数，不重用
    assert rid == 3 and eng.requests[-1].id == 3 and [r.id for r in eng.requests] == [3]
    assert_no_leak(eng) if not eng.has_unfinished_requests() else None
    with pytest.raises(ValueError, match="max_step_history"):
        LLMEngine(PARAMS, CFG, 32, block_size=4, max_step_history=0)


def test_step_reports_each_token_once():
    eng = LLMEngine(PARAMS, CFG, 32, block_size=4, max_num_batched_tokens=6)
    ids = [eng.add_request(p, 5) for p in PROMPTS[:3]]
    got = {i: [] for i in ids}
    reasons = {}
    while eng.has_unfinished_requests():
        for rid, toks, why in eng.step():
            got[rid] += toks
            reasons[rid] = why
    assert all(got[i] == eng.requests[i].output for i in ids)
    assert set(reasons.values()) == {"length"}


def test_bad_input_raises():
    eng = LLMEngine(PARAMS, CFG, 16, block_size=4)
    for args, msg in (((([], 4)), "至少要有 1 个"), (([1, 64], 4), "0..63"), (([1] * 40, 26), "max_seq"),
                      (([1, 2], 0), "max_tokens"), (([1, 2], 4, -0.5), "温度"), (([1, 2], 4, 0.0, -1), "seed"),
                      (([1, 2], 4, 0.0, 0, [1.5]), "停止")):
        with pytest.raises(ValueError, match=msg):
            eng.add_request(*args)
    with pytest.raises(ValueError, match="max_seq = 64"):
        LLMEngine(PARAMS, CFG, 15, block_size=4)
    for kw in ({"block_size": 0}, {"max_num_batched_tokens": 0}, {"max_num_seqs": 1.5}):
        with pytest.raises(ValueError):
            LLMEngine(PARAMS, CFG, 16, **kw)
    with pytest.raises(ValueError, match="不认识的键"):
        LLMEngine(PARAMS, CFG, 16, block_size=4, speculative_config={"k": 2})
    small = LMConfig(max_seq=8)
    e2 = LLMEngine(init_params(small, 0), small, 2, block_size=4)
    e2.bm.pool.n_blocks = 2
    e2.num_blocks = 1           # 一个比上下文小的池（只为了测这条检查）：8 个位置要 2 块
    with pytest.raises(ValueError, match="永远放不进来"):
        e2.add_request([1, 2, 3], 6)


def test_preempted_request_keeps_its_tokens_and_rng():
    """挤出重算：被挤出的请求带着已生成的 token 回去重 prefill，它的随机数接着用（T = 1 下才看得出丢 token）。"""
    eng = LLMEngine(PARAMS, CFG, 16, block_size=4, max_num_batched_tokens=64, max_num_seqs=6, keep_logits=True)
    long = [p + p for p in PROMPTS[:4]]
    long = [p[:28] for p in long]
    for i, p in enumerate(long):
        eng.add_request(p, 20, 1.0, 40 + i)
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.scheduler.n_preemptions > 0
    assert any(r.n_preempted for r in eng.requests)
    for i, p in enumerate(long):
        assert eng.requests[i].output == solo(p, 20, 1.0, 40 + i)
    assert_no_leak(eng)


def test_batch_invariant_mode_is_bitwise_in_float32():
    """batch_invariant=True：float32 下一个请求的 logits 和它单独跑（同样用这个模式）逐位相同。"""
    cfg = LMConfig(max_seq=64, dtype="float32")
    params = init_params(cfg, 2)
    kw = dict(block_size=4, max_num_batched_tokens=11, max_num_seqs=4, keep_logits=True, batch_invariant=True)
    eng = LLMEngine(params, cfg, 40, **kw)
    eng.generate(PROMPTS[:4], 6, temperature=1.0, seed=1)
    for i, p in enumerate(PROMPTS[:4]):
        alone = LLMEngine(params, cfg, 40, **kw)
        alone.generate([p], 6, temperature=1.0, seed=1 + i)
        assert eng.requests[i].output == alone.requests[0].output
        assert np.array_equal(np.array(eng.requests[i].logits), np.array(alone.requests[0].logits))


def test_smollm2_engine_equals_each_request_alone():
    """
    真实模型一次：SmolLM2（float64）两个请求一起跑（预算 4：提示分块 prefill、和 decode 混在一步），token 等于单独生成的。
    用它的前 2 层（共用会话里那份融合好的 float64 权重，tests/smollm2_models.py）：一起跑 == 单独跑只看分块、混批、分页的
    KV 和每个请求自己的随机数，每一层走的是同一段代码，和层数无关（2 层已经有"上一层的输出是下一层的输入"，分块时
    第二层读的是第一层写进分页缓存的 KV 算出来的）；词表（49152）、分词器、GQA、RoPE 的 θ 都是真的。
    参照（autoregressive_generate）每次调用只读最后一行 logits：它跑在 lm_rows.rows_read(model, 1) 上，提示那一遍
    只给最后一行乘 lm_head（别的行 NaN，读了就红）。
    """
    full, _, tok = smollm2_lm("float64")
    model = layer_subset(full, range(2), name="SmolLM2 的前 2 层")
    cfg = model.cfg
    prompts = [tok.encode(s) for s in ("The capital of France is", "Once upon a time")]
    eng = LLMEngine(model, cfg, blocks_for_ctx(cfg), block_size=16, max_num_batched_tokens=4)
    out = eng.generate(prompts, 3, temperature=1.0, seed=5)
    ref = rows_read(model, 1)
    for i, p in enumerate(prompts):
        assert out[i] == [int(t) for t in autoregressive_generate(ref, p, 3, 1.0, np.random.default_rng(5 + i))]
    assert_no_leak(eng)


def blocks_for_ctx(cfg):
    return -(-cfg.max_seq // 16)


def test_step_counts_read_the_weights_once_per_step():
    """一步的账：B 个同位置的 decode = ledger 的 analytic_ops(cfg, B, 1, p)（权重只记一遍）；字节按 dtype 换算。"""
    from runner_lab import modelled_step_time, step_counts
    from transformer_lab import analytic_ops
    for B, p in ((1, 0), (5, 17)):
        rows = analytic_ops(CFG, B, 1, p, last_only=True)
        c = step_counts(CFG, [(1, p, True)] * B)
        assert c["flops"] == sum(r["flops"] for r in rows)
        assert c["bytes"] == 4 * sum(r["w"] + r["kv"] for r in rows)      # float64：8 字节 = BF16 账的 4 倍
    one, many = step_counts(CFG, [(1, 9, True)]), step_counts(CFG, [(1, 9, True)] * 8)
    assert many["bytes"] < 2 * one["bytes"]                                   # 8 个序列：权重仍只读一遍
    assert modelled_step_time(many) < 8 * modelled_step_time(one)
    mid = step_counts(CFG, [(4, 0, False)])
    assert mid["flops"] < step_counts(CFG, [(4, 0, True)])["flops"]            # 不抽样的块不算 lm_head


def test_chunk_counts_equal_the_ledger_at_every_cached_length():
    """chunk_counts 按 start 的一次函数算（两遍账本外推）：和直接用账本算的逐个相等，start 很大、n > 1、不抽样都是。"""
    from runner_lab import chunk_counts
    from transformer_lab import analytic_ops
    for n, start, sample in ((1, 0, True), (1, 1, True), (1, 63, True), (7, 0, False), (7, 40, True),
                             (16, 1000, False), (3, 2047, True)):
        rows = analytic_ops(CFG, 1, n, start, last_only=True)
        want = (sum(r["flops"] for r in rows if sample or r["op"] != "lm_head"),
                4 * sum(r["w"] for r in rows if r["op"] != "embed"), 4 * sum(r["kv"] for r in rows),
                4 * sum(r["w"] for r in rows if r["op"] == "embed"))
        assert chunk_counts(CFG, n, start, sample) == want, (n, start, sample)


def test_request_metrics_by_hand():
    """TTFT、TPOT（不含第一个 token）、ITL、端到端：手算一个请求；摘要的达标率用 goodput_lab 的定义。"""
    from metrics_lab import request_metrics, summarize

    class R:
        pass
    a, b = R(), R()
    a.arrival, a.token_times = 1.0, [1.5, 1.7, 2.0]
    b.arrival, b.token_times = 2.0, [2.1]
    m = request_metrics(a)
    assert m["ttft"] == pytest.approx(0.5) and m["tpot"] == pytest.approx(0.25)
    assert m["itl"] == pytest.approx([0.2, 0.3]) and m["e2e"] == pytest.approx(1.0)
    assert request_metrics(b)["tpot"] == 0.0
    s = summarize([a, b], ttft_slo=0.2, tpot_slo=1.0)
    assert s["attainment"] == 0.5 and s["output_tokens"] == 4 and s["makespan"] == pytest.approx(1.1)
    assert s["ttft"][50] == pytest.approx(0.3)


def test_engine_goodput_falls_when_the_slo_tightens(monkeypatch):
    """
    goodput（goodput_lab 的定义）在重放的引擎上：TTFT 目标收紧，能撑住的到达率不升；目标宽到永远达标时是网格的最高率。
    时钟固定成一组有每序列开销的常数（这个性质是 goodput 的，不是标定的常数的：标定的每序列开销在这个小模型上太小，
    4096 req/s 也不排队）。
    """
    import runner_lab
    from metrics_lab import engine_goodput
    from workload_lab import poisson_arrivals
    monkeypatch.setattr(runner_lab, "CPU_COST", {"flops_per_s": 53e9, "bytes_per_s": 10.4e9, "step_s": 2e-3,
                                                 "seq_s": 0.5e-3})

    runs = {}

    def serve(rate):                                        # 结果只取决于 rate：三次找 goodput 共用每个率的一次重放
        if rate not in runs:
            arr = poisson_arrivals(rate, 12, seed=3)
            streams = {i: [0] * 8 for i in range(12)}
            eng = LLMEngine.replay(streams, CFG, 40, block_size=4, max_num_batched_tokens=32)
            ids = run_trace(eng, [(float(t), [1] * 20, 8, {}) for t in arr])
            runs[rate] = [eng.requests[i] for i in ids]
        return runs[rate]
    rates = [4.0 ** k for k in range(1, 7)]                 # 4 … 4096 个请求每秒
    loose = engine_goodput(serve, rates, ttft_slo=1e9, tpot_slo=1e9)
    assert loose["goodput"] == rates[-1]
    one = serve(rates[0])[0]                                # 低负载：没有排队
    alone = one.token_times[0] - one.arrival
    a = engine_goodput(serve, rates, ttft_slo=3 * alone, tpot_slo=1e9)
    b = engine_goodput(serve, rates, ttft_slo=1.5 * alone, tpot_slo=1e9)
    assert 0 < b["goodput"] <= a["goodput"] < rates[-1]
