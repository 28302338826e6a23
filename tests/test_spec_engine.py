"""
引擎里的投机解码（spec_engine_lab，engine_lab 的 speculative_config）：

- 外观：γ 固定、开关关着，float64 下第 i 个请求的输出 == decode_lab.speculative_generate(target, draft, prompt, n, γ, T,
  default_rng(seed + i))，每轮接受的个数也相同——T = 0 和 T = 1、几个请求一步验证、块池小到挤出、前缀缓存开着、
  停止 token 落在被接受的一段里；T = 0 时还 == 单独的贪心；
- 跳过残差（拒绝后从 p 重抽）的引擎在 T = 1 下不等于 speculative_generate（这个检查看得见那个错）；
- prompt lookup、二元语法表、自适应 γ 各自对上 decode_lab / lookup_lab 的生成器；开关关掉的步是普通 decode；
- 被拒绝的草稿用过的整块还回去；结束或中止之后每一块都空闲；
- T = 0 的重放（SpecReplay）和真的投机引擎一步一步相同（同样的段、同样的 token、同样的模型时间）。
小的随机模型（LMConfig(max_seq=64)）上跑；真实模型一次（SmolLM2 的前 3 层，float64，跳层草稿）。
"""
import numpy as np
import pytest

import decode_lab
import spec_engine_lab
from conftest import compute_early, early_result
from decode_lab import NGramLM, TransformerLM, autoregressive_generate, speculative_generate
from drafts_lab import layer_skip_draft, layer_subset
from engine_lab import LLMEngine
from lm_rows import rows_read
from lookup_lab import PromptLookup, speculative_generate_adaptive
from runner_lab import chunk_counts
from smollm2_models import smollm2_lm
from spec_engine_lab import accept_counts, greedy_agreement
from transformer_lab import LMConfig, analytic_ops, init_params, sample_inverse_cdf

CFG = LMConfig(max_seq=64, n_layers=3)
PARAMS = init_params(CFG, 1)
MODEL = TransformerLM(PARAMS, CFG)
DRAFT = layer_subset(MODEL, [0, 2], name="跳过第 1 层")
_R = np.random.default_rng(5)
PROMPTS = [[int(t) for t in _R.integers(0, CFG.vocab, size=k)] for k in (5, 23, 9, 17, 30, 2)]
N_NEW, GAMMA = 16, 3


def spec_cfg(draft=DRAFT, gamma=GAMMA, **kw):
    return dict({"method": "draft", "draft_model": draft, "num_speculative_tokens": gamma}, **kw)


def assert_no_leak(eng):
    assert not eng.has_unfinished_requests()
    assert eng.num_free_blocks == eng.num_blocks
    assert sum(eng.bm.pool.ref) == 0
    eng.bm.pool.check()


def run_all(eng, prompts, n, T, seed, stop=None):
    ids = [eng.add_request(p, n, T, seed + i, stop) for i, p in enumerate(prompts)]
    while eng.has_unfinished_requests():
        eng.step()
    return [eng.requests[i] for i in ids]


_GREEDY = {}


def greedy_tokens(p, n):
    """MODEL 在提示 p 上自己的贪心解码的前 n 个 token（list）：只看提示和 n，几个测试共用一份。"""
    key = (tuple(p), n)
    if key not in _GREEDY:
        _GREEDY[key] = [int(t) for t in autoregressive_generate(MODEL, p, n, 0.0, np.random.default_rng(0))]
    return _GREEDY[key]


_REFS = {}


def reference(i, p, T):
    """
    第 i 个提示单独生成的参考 -> (speculative_generate 的 token, 它的 stats, 整段一次前向的 logits, T = 0 时的贪心 token)。
    参考只看提示、T 和种子（3 + i），和引擎的块池、前缀缓存无关：下面三种块池 / 缓存的参数化共用一份。
    """
    key = (i, T)
    if key not in _REFS:
        want, st = speculative_generate(MODEL, DRAFT, p, N_NEW, GAMMA, T, np.random.default_rng(3 + i))
        want = [int(t) for t in want]
        ref = MODEL.full_logits([(p + want)[:-1]])[0, len(p) - 1:]
        _REFS[key] = (want, st, ref, greedy_tokens(p, N_NEW) if T == 0 else None)
    return _REFS[key]


@pytest.mark.parametrize("T", [0.0, 1.0])
@pytest.mark.parametrize("num_blocks,caching", [(64, True), (18, True), (18, False)])
def test_engine_speculative_equals_speculative_generate(T, num_blocks, caching):
    eng = LLMEngine(MODEL, CFG, num_blocks, block_size=4, max_num_batched_tokens=64, max_num_seqs=4,
                    enable_prefix_caching=caching, speculative_config=spec_cfg(), keep_logits=True)
    prompts = PROMPTS + [PROMPTS[1][:12] + [7, 7]]        # 第 7 个和第 2 个共用 3 个满块：前缀缓存命中
    reqs = run_all(eng, prompts, N_NEW, T, seed=3)
    for i, (p, req) in enumerate(zip(prompts, reqs)):
        want, st, ref, greedy = reference(i, p, T)
        assert req.output == want, f"请求 {i}"
        assert req.accepted == st["accepted"] and req.target_calls == st["target_calls"]
        assert np.max(np.abs(np.array(req.logits) - ref)) < 1e-12 * max(1.0, np.max(np.abs(ref)))
        if T == 0:
            assert req.output == greedy
    assert max(sum(1 for _, n, dec in s["chunks"] if dec) for s in eng.steps) >= 2, "几个请求在同一步验证"
    assert any(s["wasted"] for s in eng.steps) and any(r.accepted.count(GAMMA) for r in reqs)
    if num_blocks == 18:
        assert eng.scheduler.n_preemptions > 0, "块池要小到挤出请求"
    if caching:
        assert eng.bm.hits > 0
    assert_no_leak(eng)


def _skip_residual_verify(target_probs, draft_probs, drafts, rng):
    """种进去的错：拒绝之后从 p 重抽，不从残差 norm(max(0, p − q)) 抽（其余和 verify_chain 一样）。"""
    n = 0
    while n < len(drafts) and rng.random() * draft_probs[n][drafts[n]] < target_probs[n][drafts[n]]:
        n += 1
    return n, int(sample_inverse_cdf(target_probs[n], rng.random()))


def test_t1_check_goes_red_when_the_residual_is_skipped(monkeypatch):
    """上面 T = 1 的比较看得见"拒绝后从 p 重抽"：换上这个错的验证，至少一个请求的输出就和 speculative_generate 不同。"""
    monkeypatch.setattr(spec_engine_lab, "verify_chain", _skip_residual_verify)
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, max_num_batched_tokens=64, speculative_config=spec_cfg())
    reqs = run_all(eng, PROMPTS, N_NEW, 1.0, seed=3)
    same = [req.output == [int(t) for t in speculative_generate(MODEL, DRAFT, p, N_NEW, GAMMA, 1.0,
                                                                np.random.default_rng(3 + i))[0]]
            for i, (p, req) in enumerate(zip(PROMPTS, reqs))]
    assert not all(same)


def test_stop_token_inside_an_accepted_run_cuts_there():
    """停止 token 是一轮里被接受的草稿（不是这一轮的最后一个 token）：输出截在它那里，和 speculative_generate 的一样。"""
    found = None
    for i, p in enumerate(PROMPTS):
        out, st = speculative_generate(MODEL, DRAFT, p, N_NEW, GAMMA, 0.0, np.random.default_rng(i))
        out, pos = [int(t) for t in out], 0
        for n in st["accepted"]:
            for j in range(pos, min(pos + n, len(out))):
                if n >= 2 and j < pos + n - 1 and out[j] not in out[:j]:   # 一段被接受的草稿中间、第一次出现
                    found = found or (i, p, out[j], j)
            pos += n + 1
    assert found, "找一个落在被接受的一段中间的 token"
    i, p, stop, j = found
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, speculative_config=spec_cfg())
    rid = eng.add_request(p, N_NEW, 0.0, i, stop)
    while eng.has_unfinished_requests():
        eng.step()
    want = [int(t) for t in speculative_generate(MODEL, DRAFT, p, N_NEW, GAMMA, 0.0, np.random.default_rng(i),
                                                 stop=stop)[0]]
    assert eng.requests[rid].output == want and len(want) == j + 1 and want[-1] == stop
    assert eng.requests[rid].finish_reason == "stop"
    assert_no_leak(eng)


REPEATS = [p[:6] * 3 + p[:3] for p in PROMPTS[1:5]]       # 会重复的提示：prompt lookup 找得到


@pytest.mark.parametrize("gmax", [None, 6])
@pytest.mark.parametrize("T", [0.0, 1.0])
def test_prompt_lookup_and_adaptive_gamma_equal_lookup_lab(T, gmax):
    sc = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 2, "num_speculative_tokens_max": gmax}
    eng = LLMEngine(MODEL, CFG, 40, block_size=4, max_num_batched_tokens=32, speculative_config=sc)
    reqs = run_all(eng, REPEATS, 12, T, seed=11)
    for i, (p, req) in enumerate(zip(REPEATS, reqs)):
        want, st = speculative_generate_adaptive(MODEL, PromptLookup(2), p, 12, 2, T, np.random.default_rng(11 + i),
                                                 gamma_max=gmax)
        assert req.output == [int(t) for t in want]
        assert req.accepted == st["accepted"] and req.drafted == st["drafted"]
    assert sum(sum(r.drafted) for r in reqs) > 0 and (T > 0 or sum(sum(r.accepted) for r in reqs) > 0)
    if gmax and T == 0:
        assert max(max(r.drafted) for r in reqs) > 2, "自适应 γ 长过起始的 2"
    assert_no_leak(eng)


def test_model_draft_with_adaptive_gamma_equals_lookup_lab():
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, speculative_config=spec_cfg(gamma=1, num_speculative_tokens_max=5))
    reqs = run_all(eng, PROMPTS[:4], N_NEW, 1.0, seed=21)
    for i, (p, req) in enumerate(zip(PROMPTS[:4], reqs)):
        want, st = speculative_generate_adaptive(MODEL, DRAFT, p, N_NEW, 1, 1.0, np.random.default_rng(21 + i),
                                                 gamma_max=5)
        assert req.output == [int(t) for t in want] and req.drafted == st["drafted"]
    assert_no_leak(eng)


def test_bigram_draft_equals_speculative_generate():
    toks = np.asarray([autoregressive_generate(MODEL, p, 20, 1.0, np.random.default_rng(k)) for k, p in
                       enumerate(PROMPTS)])
    bigram = NGramLM.fit(toks, CFG.vocab)
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, speculative_config=spec_cfg(draft=bigram))
    reqs = run_all(eng, PROMPTS, N_NEW, 1.0, seed=5)
    for i, (p, req) in enumerate(zip(PROMPTS, reqs)):
        want, _ = speculative_generate(MODEL, bigram, p, N_NEW, GAMMA, 1.0, np.random.default_rng(5 + i))
        assert req.output == [int(t) for t in want]
    assert all(s["draft_passes"] == 0 for s in eng.steps)
    assert_no_leak(eng)


def test_switch_turns_speculation_off_at_the_batch_size_and_greedy_is_kept():
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, max_num_seqs=4,
                    speculative_config=spec_cfg(disable_by_batch_size=3))
    reqs = run_all(eng, PROMPTS, N_NEW, 0.0, seed=0)
    for p, req in zip(PROMPTS, reqs):
        assert req.output == greedy_tokens(p, N_NEW)
    on = [s["spec"] for s in eng.steps]
    assert not all(on) and any(on)
    for s in eng.steps:                                # 关着的步：每个序列 1 个 token（没有草稿位置）
        if not s["spec"]:
            assert s["verified"] == 0 and s["draft_passes"] == 0
    assert_no_leak(eng)


def test_rejected_drafts_give_whole_blocks_back_and_abort_leaks_nothing():
    eng = LLMEngine(MODEL, CFG, 64, block_size=2, speculative_config=spec_cfg(gamma=5))
    ids = [eng.add_request(p, N_NEW, 1.0, 7 + i) for i, p in enumerate(PROMPTS)]
    for _ in range(3):
        eng.step()
    for req in (eng.requests[i] for i in ids):          # 每一步之后：块表只放得下确认过的 token（+ 下一个要喂的）
        if req in eng.scheduler.running and req.accepted:         # 在跑、做过一轮的
            assert len(req.block_table) == -(-len(req.tokens) // 2)
    eng.abort_request(ids[1])
    eng.abort_request(ids[4])
    while eng.has_unfinished_requests():
        eng.step()
    assert sum(s["freed"] for s in eng.steps) > 0
    assert eng.requests[ids[1]].finish_reason == "abort"
    assert_no_leak(eng)


def test_accept_counts_and_tokens_per_target_call():
    eng = LLMEngine(MODEL, CFG, 64, block_size=4, speculative_config=spec_cfg())
    req = run_all(eng, PROMPTS[:1], N_NEW, 1.0, seed=2)[0]
    h = accept_counts(req, GAMMA)
    assert h.sum() == len(req.accepted) == req.target_calls
    assert list(h) == [req.accepted.count(k) for k in range(GAMMA + 1)]
    assert sum(req.accepted) + len(req.accepted) >= len(req.output)        # 每轮 n + 1 个（最后一轮可能截掉）


def test_verify_rows_are_counted_on_every_verified_position():
    """验证 γ 个草稿要 γ + 1 行 lm_head：chunk_counts(…, k) 的 FLOPs == 账本里 lm_head 算在每个位置上的（k = n 时）。"""
    for n, start in ((4, 0), (5, 17), (1, 30)):
        rows = analytic_ops(CFG, 1, n, start, last_only=False)
        assert chunk_counts(CFG, n, start, n)[0] == sum(r["flops"] for r in rows)


@pytest.mark.parametrize("method", ["draft", "ngram"])
def test_t0_replay_equals_the_real_speculative_engine_step_by_step(method):
    prompts = REPEATS + PROMPTS[:3]
    if method == "draft":
        sc = spec_cfg(disable_by_batch_size=6)
    else:
        sc = {"method": "ngram", "num_speculative_tokens": 3}
    kw = dict(block_size=4, max_num_batched_tokens=24, max_num_seqs=5, speculative_config=sc)
    real = LLMEngine(MODEL, CFG, 30, **kw)
    reqs = run_all(real, prompts, N_NEW, 0.0, seed=0)
    streams = {r.id: greedy_tokens(p, N_NEW + 3) for r, p in zip(reqs, prompts)}   # γ 个多出来的：验证到 max_tokens 之后
    agree = None
    if method == "draft":
        agree = {}
        for r, p in zip(reqs, prompts):
            seq = [p + streams[r.id][:-1]]
            agree[r.id] = greedy_agreement(MODEL.full_logits(seq)[0], DRAFT.full_logits(seq)[0])[len(p) - 1:]
    rep = LLMEngine.replay(streams, CFG, 30, agree=agree, **kw)
    reqs2 = run_all(rep, prompts, N_NEW, 0.0, seed=0)
    assert [r.output for r in reqs2] == [r.output for r in reqs]
    assert [r.accepted for r in reqs2] == [r.accepted for r in reqs]
    keys = ("chunks", "tokens", "dt", "verified", "wasted", "freed", "blocks_used", "spec", "draft_passes")
    assert [{k: s[k] for k in keys} for s in rep.steps] == [{k: s[k] for k in keys} for s in real.steps]
    assert real.scheduler.n_preemptions > 0
    assert_no_leak(rep)


def test_bad_speculative_config_raises():
    base = spec_cfg()
    for bad, msg in (({"method": "eagle"}, "method"), ({"num_speculative_tokens": 0}, "γ"),
                     ({"draft_model": "int4"}, "draft_model"), ({"disable_by_batch_size": 0}, "disable_by_batch_size"),
                     ({"num_speculative_tokens_max": 2}, "num_speculative_tokens_max"), ({"gamma": 2}, "不认识的键"),
                     ({"draft_model": TransformerLM(init_params(LMConfig(vocab=32), 0), LMConfig(vocab=32))}, "词表"),
                     ({"prompt_lookup_max": 3}, "prompt_lookup_max")):
        with pytest.raises(ValueError, match=msg):
            LLMEngine(MODEL, CFG, 16, block_size=4, speculative_config=dict(base, **bad))
    with pytest.raises(ValueError, match="draft_model"):
        LLMEngine(MODEL, CFG, 16, block_size=4, speculative_config={"method": "ngram", "num_speculative_tokens": 2,
                                                                    "draft_model": DRAFT})
    with pytest.raises(ValueError, match="预算"):
        LLMEngine(MODEL, CFG, 16, block_size=4, max_num_batched_tokens=3, speculative_config=base)
    eng = LLMEngine(MODEL, CFG, 16, block_size=4, speculative_config=base)
    with pytest.raises(ValueError, match="草稿 3"):
        eng.add_request([1] * 40, 23)                  # 40 + 23 − 1 = 62 ≤ 64，再加 3 个草稿位置就超了
    with pytest.raises(ValueError, match="dict"):
        LLMEngine(MODEL, CFG, 16, block_size=4, speculative_config=[("method", "ngram")])


def _smollm2_pair():
    """下面的测试的目标（SmolLM2 的前 3 层）、草稿（跳过它的第 1 层）和两个提示。"""
    full, _, tok = smollm2_lm("float64")
    model = layer_subset(full, range(3), name="SmolLM2 的前 3 层")
    return model, layer_skip_draft(model, 1, 1), [tok.chat("Name a primary color."), tok.chat("Say hello in Spanish.")]


def _smollm2_refs():
    """
    下面的测试的参照：每个提示单独的 speculative_generate（γ = 2，T = 1，种子 4 + i，3 个新 token）-> [(输出, 统计), …]。
    后台装模型的子进程提前算（conftest.compute_early：同一份 float64 模型，结果逐位相同）。
    """
    model, draft, prompts = _smollm2_pair()
    ref_t, ref_d = rows_read(model, 2 + 1), rows_read(draft, 1)
    return [([int(t) for t in out], st) for out, st in
            (speculative_generate(ref_t, ref_d, p, 3, 2, 1.0, np.random.default_rng(4 + i), stop=2)
             for i, p in enumerate(prompts))]


compute_early(_smollm2_refs)


def test_smollm2_layer_skip_draft_in_the_engine_equals_speculative_generate():
    """
    真实模型（float64）：跳层自草稿，T = 1，两个请求一起验证 == speculative_generate，每轮接受的个数也相同。
    目标是 SmolLM2 的前 3 层（共用会话里那份融合好的权重），草稿跳过它的第 1 层。只用前几层证明的是同一件事：
    引擎 == speculative_generate 只看两边是不是同样用随机数、同样验证、同样管两个模型的缓存，每一层走的是同一段代码，
    和层数无关；真实模型比玩具多的（49152 的词表、分词器和对话模板、GQA、RoPE 的 θ）都还在。这两个提示下拒绝和
    γ 个全部接受都有（最后一行断言它）。时间几乎全在前向的次数上（每次都把 226 MB 的 float64 lm_head 读一遍），
    3 层比 6 层约省三分之一。
    参照（speculative_generate）跑在 rows_read 的浅拷贝上：它每次调用只读目标的最后 γ + 1 行、草稿的最后一行，
    别的行（14 个 token 的提示各一遍、草稿追上的那几行）不乘 lm_head（每行 2.8e7 次乘加，是这里的大头）、填 NaN：
    它要是读了哪一行，抽出来的就不是引擎的 token，断言变红。
    """
    model, draft, prompts = _smollm2_pair()
    cfg = model.cfg
    eng = LLMEngine(model, cfg, -(-cfg.max_seq // 16), speculative_config=spec_cfg(draft=draft, gamma=2))
    reqs = run_all(eng, prompts, 3, 1.0, seed=4, stop=2)
    for req, (want, st) in zip(reqs, early_result(_smollm2_refs)):
        assert req.output == want and req.accepted == st["accepted"]
    assert_no_leak(eng)
    accepted = [a for req in reqs for a in req.accepted]
    assert min(accepted) == 0 and max(accepted) == 2


def test_decode_lab_is_the_one_verify_step():
    """引擎的接受 / 拒绝就是 decode_lab.verify_chain（不是另写的一份）。"""
    assert spec_engine_lab.verify_chain is decode_lab.verify_chain



_PREFIX_KV = {}      # (0 = 目标 / 1 = 草稿, 前缀的 token) -> 单独前向一遍算出的最后一块的 (K, V)：同一条前缀只算一次


def prefix_kv(which, toks, bs):
    key = (which, tuple(toks))
    if key not in _PREFIX_KV:
        model = (MODEL, DRAFT)[which]
        cache = model.new_cache(1)
        model.forward(np.asarray([toks]), cache)
        _PREFIX_KV[key] = tuple(c[:, 0, :, len(toks) - bs:len(toks)] for c in (cache.k, cache.v))
    return _PREFIX_KV[key]


def assert_cached_blocks_hold_both_models_kv(eng):
    """
    每一块登记进前缀缓存的块：目标和草稿在它的槽里的 K、V == 把它的整条前缀单独前向一遍算出的。
    每一步之后都逐块核对引擎的槽；期望值只看前缀的 token（模型固定），所以同一条前缀的前向只算一次（prefix_kv）。
    """
    bm, bs, n = eng.bm, eng.block_size, 0
    for i in range(eng.num_blocks):
        if bm.key[i] is None:
            continue
        n += 1
        chain, j = [], i
        while j != -1:
            chain.append(j)
            j = bm.parent[j]
        toks = [t for b in chain[::-1] for t in bm.tokens[b]]
        for which, runner in enumerate((eng.runner.target, eng.runner.draft)):
            for got, want in zip((runner.k, runner.v), prefix_kv(which, toks, bs)):
                g = got[:, i * bs:(i + 1) * bs].transpose(0, 2, 1, 3)            # [L, Hkv, bs, hd]
                assert np.max(np.abs(g - want)) < 1e-9, f"块 {i}"
    return n


@pytest.mark.parametrize("gamma", [1, 2])
def test_prefix_cache_registers_a_block_only_when_the_draft_kv_is_written_too(gamma):
    """
    全部接受的一轮之后草稿的缓存落后一个位置（最后一个草稿还没喂）：那时写满的块不能登记进前缀缓存，
    否则被挤出后重新命中（或者别的请求命中）的块里，草稿在那个槽的 KV 是作废的。每一步之后逐块核对。
    """
    eng = LLMEngine(MODEL, CFG, 40, block_size=2, max_num_seqs=4, speculative_config=spec_cfg(gamma=gamma))
    for i, p in enumerate(PROMPTS):
        eng.add_request(p, N_NEW, 0.0, i)
    checked = 0
    while eng.has_unfinished_requests():
        eng.step()
        checked += assert_cached_blocks_hold_both_models_kv(eng)
    assert eng.scheduler.n_preemptions > 0 and checked > 0
    assert_no_leak(eng)

@pytest.mark.parametrize("T", [0.0, 1.0])
def test_a_follow_up_turn_hits_generated_blocks_and_stays_exact(T):
    """
    第二轮对话 = 第一轮的提示 + 回答 + 新的一句：它命中第一轮生成的 token 所在的满块。那些块登记进缓存时草稿的 KV
    必须也写好了（全部接受的一轮之后草稿落后一个位置）：否则第二轮的草稿读到作废的 KV，T = 1 时就和
    speculative_generate 不同。
    """
    eng = LLMEngine(MODEL, CFG, 64, block_size=2, speculative_config=spec_cfg(gamma=4))
    hits = 0
    for i, p in enumerate(PROMPTS[:4]):
        first = run_all(eng, [p], 20, T, seed=30 + i)[0]
        follow = p + first.output + [5, 9]
        h0 = eng.bm.hits
        second = run_all(eng, [follow], 8, T, seed=40 + i)[0]
        hits += eng.bm.hits - h0
        want = speculative_generate(MODEL, DRAFT, follow, 8, 4, T, np.random.default_rng(40 + i))[0]
        assert second.output == [int(t) for t in want]
    assert hits > 0
    assert_no_leak(eng)
