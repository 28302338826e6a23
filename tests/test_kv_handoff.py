"""
解耦的交接（handoff_lab、LLMEngine.export_request / import_request、BlockManager.reserve / cancel、Scheduler.admit），
全在一个进程里（两个引擎）；进程之间的见 test_routers.py。

- 神谕：float64 下，先在 prefill 引擎里算完提示、抽出第一个 token，导出、导入 decode 引擎接着生成的请求
  == decode_lab.autoregressive_generate(…, default_rng(seed))，逐 token 相同——两边都开前缀缓存、prefill 分块、
  decode 那边块池小到要挤出、T = 0 和 T = 1；不带随机数发生器的状态时 T = 1 的就不相同（这个测试能变红）；
- K、V 导入再导出逐位相同；nbytes == 2 · 层 · KV 头 · head_dim · 8 · n_tokens；
- 不漏块：结束、中止、拒绝之后两边每一块都空闲；坏输入：ValueError，引擎不动。
"""
import threading
from multiprocessing import Pipe

import numpy as np
import pytest

from block_manager_lab import Reservation
from decode_lab import TransformerLM, autoregressive_generate
from engine_lab import LLMEngine
from handoff_lab import KVHandoff, fingerprint, kv_bytes_per_token, recv_handoff, send_handoff
from transformer_lab import LMConfig, init_params

CFG = LMConfig(max_seq=64)
PARAMS = init_params(CFG, 1)
MODEL = TransformerLM(PARAMS, CFG)
_R = np.random.default_rng(11)
SYSTEM = [int(t) for t in _R.integers(0, CFG.vocab, size=9)]            # 共享的前缀：两边的前缀缓存都会命中
PROMPTS = [SYSTEM + [int(t) for t in _R.integers(0, CFG.vocab, size=k)] for k in (3, 14, 1, 20)] + \
          [[int(t) for t in _R.integers(0, CFG.vocab, size=k)] for k in (2, 25)]
N_NEW = 12
_SOLO = {}


def solo(prompt, n, T, seed):
    key = (tuple(prompt), n, T, seed)
    if key not in _SOLO:
        _SOLO[key] = [int(t) for t in autoregressive_generate(MODEL, prompt, n, T, np.random.default_rng(seed))]
    return _SOLO[key]


def assert_no_leak(eng):
    assert not eng.has_unfinished_requests()
    assert eng.num_free_blocks == eng.num_blocks
    assert int(np.sum(eng.bm.pool.ref)) == 0
    eng.bm.pool.check()


def run_pd(pre, dec, prompts, T, seed, n_new=N_NEW, tamper=None):
    """
    两个引擎的解耦：prefill 引擎抽出第一个 token 的那一步之后导出，decode 引擎导入（收不下就排着，背压），
    跑到全部结束 -> 每个提示的输出。tamper(h)：导入之前改交接（测试用来去掉随机数发生器的状态）。
    """
    out, src, queue = {}, {}, []
    for i, p in enumerate(prompts):
        src[pre.add_request(p, n_new, T, seed + i)] = i
    dst = {}
    while pre.has_unfinished_requests() or queue or dec.has_unfinished_requests():
        for rid, new, fin in pre.step():
            i = src[rid]
            out[i] = list(new)
            if fin is None:
                queue.append((i, pre.export_request(rid)))
        while queue:
            i, h = queue[0]
            if tamper is not None:
                tamper(h)
            rid = dec.import_request(h)
            if rid is None:
                break
            dst[rid] = i
            queue.pop(0)
        for rid, new, fin in dec.step():
            out[dst[rid]].extend(new)
    return [out[i] for i in range(len(prompts))]


@pytest.mark.parametrize("T", [0.0, 1.0])
@pytest.mark.parametrize("pre_budget,dec_blocks", [(256, 64), (5, 16)])
def test_pd_handoff_equals_each_request_alone(T, pre_budget, dec_blocks):
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4, max_num_batched_tokens=pre_budget, max_num_seqs=3)
    dec = LLMEngine(PARAMS, CFG, dec_blocks, block_size=4, max_num_seqs=4)
    got = run_pd(pre, dec, PROMPTS, T, seed=5)
    for i, p in enumerate(PROMPTS):
        assert got[i] == solo(p, N_NEW, T, 5 + i), f"请求 {i}"
    if dec_blocks == 16:
        assert dec.scheduler.n_preemptions > 0, "decode 那边的块池要小到挤出（导入的请求被挤出、重算）"
    assert pre.bm.hits > 0 and dec.bm.hits >= 0
    assert_no_leak(pre)
    assert_no_leak(dec)


def test_T1_needs_the_generator_state():
    """不带随机数发生器的状态（decode 那边从 default_rng(seed) 重新开始）：T = 1 的输出和单独生成的不同。"""
    def fresh_rng(h):
        h.rng_state = np.random.default_rng(h.seed).bit_generator.state
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    dec = LLMEngine(PARAMS, CFG, 32, block_size=4)
    got = run_pd(pre, dec, PROMPTS, 1.0, seed=5, tamper=fresh_rng)
    assert any(got[i] != solo(p, N_NEW, 1.0, 5 + i) for i, p in enumerate(PROMPTS))


def prefilled(eng, prompt, n_new=N_NEW, T=1.0, seed=3, **kw):
    rid = eng.add_request(prompt, n_new, T, seed, **kw)
    while not eng.requests[rid].output:
        eng.step()
    return rid


def test_kv_imported_equals_exported_bit_for_bit_and_nbytes_formula():
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    dec = LLMEngine(PARAMS, CFG, 32, block_size=4)
    h = pre.export_request(prefilled(pre, PROMPTS[3]))
    n = len(PROMPTS[3])
    assert h.n_tokens == n and h.k.shape == (2, n, 2, 8)
    assert h.nbytes == 2 * 2 * 2 * 8 * 8 * n == kv_bytes_per_token(CFG) * n      # 2 · 层 · KV 头 · head_dim · 8 字节
    # 导出的 K 就是单独一次前向在这些位置的 K
    sess = MODEL.session()
    sess.logits(PROMPTS[3])
    k0, v0 = h.k.copy(), h.v.copy()
    rid = dec.import_request(h)
    h2 = dec.export_request(rid)
    assert h2.k.tobytes() == k0.tobytes() and h2.v.tobytes() == v0.tobytes()
    assert h2.rng_state == h.rng_state and h2.tokens == h.tokens
    assert_no_leak(pre)
    assert_no_leak(dec)


def test_export_refusals():
    eng = LLMEngine(PARAMS, CFG, 32, block_size=4, max_num_batched_tokens=4)
    rid = eng.add_request(PROMPTS[3], 5)
    eng.step()                                                  # prefill 只算了一段
    with pytest.raises(ValueError, match="len\\(tokens\\) − 1"):
        eng.export_request(rid)
    one = eng.add_request(PROMPTS[0], 1)                        # max_tokens 1：在 prefill 那边就结束
    while eng.has_unfinished_requests():
        eng.step()
    for r in (rid, one):
        with pytest.raises(ValueError, match="不在运行"):
            eng.export_request(r)
    with pytest.raises(ValueError):
        eng.export_request(99)
    spec = LLMEngine(PARAMS, CFG, 32, block_size=4, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    r = prefilled(spec, PROMPTS[0])
    with pytest.raises(ValueError, match="speculative_config"):
        spec.export_request(r)


def _state(eng):
    return (eng.num_free_blocks, eng.requests.n_issued, len(eng.scheduler.running), dict(eng.bm.table))


def test_bad_handoffs_raise_and_leave_the_engine_untouched():
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    h = pre.export_request(prefilled(pre, PROMPTS[1]))
    other = LLMEngine(init_params(CFG, 2), CFG, 32, block_size=4)          # 同样的配置，别的权重
    cfg32 = LMConfig(max_seq=64, dtype="float32")
    e32 = LLMEngine(init_params(cfg32, 1), cfg32, 32, block_size=4)
    dec = LLMEngine(PARAMS, CFG, 32, block_size=4)
    prefilled(dec, PROMPTS[0])
    before = _state(dec)
    with pytest.raises(ValueError, match="另一个模型"):
        other.import_request(h)
    with pytest.raises(ValueError):                             # 另一个 dtype（配置也不同，所以指纹先不符）
        e32.import_request(h)
    import dataclasses
    bad = dataclasses.replace(h, k=h.k.astype(np.float32), v=h.v.astype(np.float32))
    with pytest.raises(ValueError, match="dtype"):
        dec.import_request(bad)
    bad = dataclasses.replace(h, dtype="float32")
    with pytest.raises(ValueError, match="dtype"):
        dec.import_request(bad)
    never = dataclasses.replace(h, max_tokens=CFG.max_seq)      # 提示 + max_tokens − 1 > 上下文：永远放不下
    with pytest.raises(ValueError, match="永远放不下"):
        dec.import_request(never)
    with pytest.raises(ValueError, match="形状"):
        dec.import_request(dataclasses.replace(h, k=h.k[:, 1:], v=h.v[:, 1:]))
    with pytest.raises(ValueError, match="已经结束"):
        dec.import_request(dataclasses.replace(h, max_tokens=1))
    small = dec.bm.reserve(4)
    with pytest.raises(ValueError, match="放不下"):
        dec.import_request(h, small)
    dec.bm.cancel(small)
    with pytest.raises(ValueError, match="预留"):
        dec.import_request(h, pre.bm.reserve(len(PROMPTS[1]) + 1))
    assert _state(dec) == before
    with pytest.raises(ValueError, match="KVHandoff"):
        dec.import_request({"tokens": h.tokens})


def test_fingerprint_is_blake2b_of_the_config_and_every_array_in_c_order():
    """
    指纹按它的定义独立重算：BLAKE2b（16 字节）依次吃进 repr(配置)，再按键排好的每个数组的 (形状, dtype) 和它
    C 顺序的字节（tobytes）。不连续的数组（和词嵌入共用的 lm_head 那样的转置视图，这里大到要分好几块哈希）摘要和
    它连续的拷贝相同；换一个权重的一位、换一个转置，指纹都变。
    """
    import hashlib
    rng = np.random.default_rng(0)
    emb = rng.standard_normal((4096, 160))                      # 5.2 MB：转置之后不连续，分两块以上哈希
    params = {"tok_emb": emb, "lm_head": emb.T, "layers": [{"w": rng.standard_normal((3, 5))[:, ::2]}],
              "norm": np.float64(1.5) * np.ones(7)}

    def by_hand(p, cfg):
        h = hashlib.blake2b(repr(cfg).encode(), digest_size=16)
        for a in (p["layers"][0]["w"], p["lm_head"], p["norm"], p["tok_emb"]):   # 键排好：layers、lm_head、norm、tok_emb
            h.update(repr((a.shape, a.dtype.str)).encode())
            h.update(a.tobytes(order="C"))
        return h.hexdigest()

    assert not params["lm_head"].flags.c_contiguous and not params["layers"][0]["w"].flags.c_contiguous
    assert fingerprint(params, CFG) == by_hand(params, CFG)
    copied = {**params, "lm_head": np.ascontiguousarray(emb.T)}
    assert fingerprint(copied, CFG) == fingerprint(params, CFG)
    flipped = emb.copy()
    flipped[4095, 159] = np.nextafter(flipped[4095, 159], np.inf)   # 最后一块里的最后一个数
    assert fingerprint({**params, "lm_head": flipped.T}, CFG) != fingerprint(params, CFG)
    assert fingerprint({**params, "lm_head": np.ascontiguousarray(emb)}, CFG) != fingerprint(params, CFG)


def test_back_pressure_refuses_without_preempting_then_admits():
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    h = pre.export_request(prefilled(pre, PROMPTS[3]))
    dec = LLMEngine(PARAMS, CFG, 32, block_size=4, max_num_seqs=1)
    busy = prefilled(dec, PROMPTS[4], n_new=3)
    before = _state(dec)
    assert dec.import_request(h) is None                        # 没有序列的空位
    assert _state(dec) == before and dec.requests[busy].n_preempted == 0
    while dec.has_unfinished_requests():
        dec.step()
    full = LLMEngine(PARAMS, CFG, 16, block_size=4)
    hog = full.bm.reserve(60)                                   # 占掉 15 块，只剩 1 块
    assert full.import_request(h) is None                       # 块不够
    assert full.num_free_blocks == 1
    full.bm.cancel(hog)
    rid = dec.import_request(h)
    assert rid is not None
    while dec.has_unfinished_requests():
        dec.step()
    assert dec.requests[rid].output == solo(PROMPTS[3], N_NEW, 1.0, 3)
    assert_no_leak(dec)
    assert_no_leak(full)


def test_reservation_is_used_never_preempted_and_cancel_returns_blocks():
    dec = LLMEngine(PARAMS, CFG, 16, block_size=4, max_num_seqs=4)
    r = dec.bm.reserve(len(PROMPTS[3]) + 1)
    assert isinstance(r, Reservation) and len(r.blocks) == 8 and dec.num_free_blocks == 8
    assert dec.bm.reserve(64) is None                           # 现在不够：稍后再试
    with pytest.raises(ValueError, match="永远"):
        dec.bm.reserve(65)
    with pytest.raises(ValueError):
        dec.bm.reserve(0)
    # 别的请求挤来挤去，预留的块不动
    for i in (0, 2):
        dec.add_request(PROMPTS[i], N_NEW, 0.0, i)
    while dec.has_unfinished_requests():
        dec.step()
        assert all(dec.bm.pool.ref[b] == 1 for b in r.blocks)
    assert dec.scheduler.n_preemptions > 0
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    h = pre.export_request(prefilled(pre, PROMPTS[3]))
    rid = dec.import_request(h, r)
    assert dec.requests[rid].block_table == r.blocks and not r.active
    with pytest.raises(ValueError, match="预留"):
        dec.import_request(h, r)                                # 用过的预留
    dec.abort_request(rid)
    dec.step()
    assert_no_leak(dec)
    r2 = dec.bm.reserve(10)
    dec.bm.cancel(r2)
    dec.bm.cancel(r2)                                           # 第二次：什么都不做
    assert_no_leak(dec)
    with pytest.raises(ValueError):
        dec.bm.cancel(pre.bm.reserve(4))


def test_import_writes_fresh_blocks_and_the_older_cached_block_stays():
    dec = LLMEngine(PARAMS, CFG, 32, block_size=4)
    first = prefilled(dec, PROMPTS[1], n_new=2)
    while dec.has_unfinished_requests():
        dec.step()
    table = dict(dec.bm.table)
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    h = pre.export_request(prefilled(pre, PROMPTS[1]))
    rid = dec.import_request(h)
    assert set(dec.requests[rid].block_table).isdisjoint(table.values())    # 新块，不去重
    assert all(dec.bm.table[k] == b for k, b in table.items())              # 缓存着的仍是旧块
    assert dec.requests[first].finish_reason == "length"
    while dec.has_unfinished_requests():
        dec.step()
    assert_no_leak(dec)


def _roundtrip(h, via, copy=True):
    a, b = Pipe()
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("n", send_handoff(a, h, via)))
    t.start()
    got = recv_handoff(b, copy=copy)
    t.join()
    a.close()
    b.close()
    return got, box["n"]


def _shm_names():
    import os
    return {f for f in os.listdir("/dev/shm") if f.startswith("psm_")} if os.path.isdir("/dev/shm") else set()


@pytest.mark.parametrize("via", ["pipe", "shm"])
def test_wire_roundtrip_is_bit_exact_and_leaves_no_segment(via):
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    h = pre.export_request(prefilled(pre, PROMPTS[3], logprobs=2))
    before = _shm_names()
    got, n = _roundtrip(h, via)
    assert isinstance(got, KVHandoff) and got.meta() == h.meta()
    assert got.k.tobytes() == h.k.tobytes() and got.v.tobytes() == h.v.tobytes()
    assert (n > h.nbytes) if via == "pipe" else (0 < n < h.nbytes)         # 共享内存：线上只有头
    assert got.wire_bytes == n
    zc, _ = _roundtrip(h, via, copy=False)
    dec = LLMEngine(PARAMS, CFG, 32, block_size=4)
    rid = dec.import_request(zc)
    zc.release()
    assert _shm_names() == before
    while dec.has_unfinished_requests():
        dec.step()
    assert dec.requests[rid].output == solo(PROMPTS[3], N_NEW, 1.0, 3)
    assert len(dec.requests[rid].logprobs) == N_NEW
    with pytest.raises(ValueError):
        send_handoff(None, h, via="tcp")


def test_a_reservation_larger_than_the_request_returns_its_surplus():
    """预留比请求最多要的块还多：多出来的导入时就还回去（种下的错：不还，结束后块漏掉）。"""
    pre = LLMEngine(PARAMS, CFG, 32, block_size=4)
    h = pre.export_request(prefilled(pre, PROMPTS[2], n_new=3))
    dec = LLMEngine(PARAMS, CFG, 16, block_size=4)
    r = dec.bm.reserve(64)
    rid = dec.import_request(h, r)
    assert len(dec.requests[rid].block_table) == 3 and dec.num_free_blocks == 13     # 10 + 3 − 1 = 12 个位置 = 3 块
    while dec.has_unfinished_requests():
        dec.step()
    assert dec.requests[rid].output == solo(PROMPTS[2], 3, 1.0, 3)
    assert_no_leak(dec)
