"""
block_manager_lab 手算：引用计数、链式哈希、强行碰撞（很小的哈希）永远不会命中、LRU 挤出、共享的块不会被提前放掉。
"""
import numpy as np
import pytest

from block_manager_lab import BlockManager, BlockPool, chain_hash
from decode_lab import TransformerLM, autoregressive_generate
from engine_lab import LLMEngine
from transformer_lab import LMConfig, init_params


class Req:
    def __init__(self, tokens):
        self.tokens, self.block_table, self.n_cached_blocks = list(tokens), [], 0


def admit(bm, tokens, computed=True):
    r = Req(tokens)
    hits = bm.match_prefix(r.tokens)
    assert bm.can_allocate(hits, len(tokens))
    bm.allocate(r, hits, len(tokens))
    if computed:
        bm.commit_full(r, r.tokens, len(tokens))
    return r, hits


def test_pool_ref_counts_and_free_list():
    pool = BlockPool(3)
    a, b = pool.take(), pool.take()
    assert (a, b, pool.num_free) == (0, 1, 1)
    pool.incref(a)
    pool.decref(a)
    assert pool.ref[a] == 1 and pool.num_free == 1
    pool.decref(a)
    pool.decref(b)
    assert list(pool.free) == [2, 0, 1]          # 放回的排在表尾
    with pytest.raises(RuntimeError, match="重复释放"):
        pool.decref(a)
    pool.check()
    with pytest.raises(ValueError):
        BlockPool(0)


def test_prefix_hit_shares_blocks_and_counts_refs():
    bm = BlockManager(8, 4)
    a, hits = admit(bm, range(10))                # 两个满块 + 两个 token
    assert hits == [] and len(a.block_table) == 3
    b, hits = admit(bm, list(range(8)) + [50, 51, 52])
    assert hits == a.block_table[:2]              # 两个满块命中
    assert [bm.pool.ref[i] for i in a.block_table] == [2, 2, 1]
    bm.free(a)
    assert [bm.pool.ref[i] for i in b.block_table[:2]] == [1, 1]   # 共享的块还被 b 用着：不在空闲表里
    assert all(i not in bm.pool.free for i in b.block_table)
    bm.free(b)
    assert bm.num_free_blocks == 8 and sum(bm.pool.ref) == 0


def test_chain_key_depends_on_parent():
    """同样的第二块 token、不同的第一块：不命中（键链着父块的键）。"""
    bm = BlockManager(8, 4)
    admit(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.match_prefix([9, 9, 9, 9, 5, 6, 7, 8, 9]) == []
    assert len(bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8, 0])) == 2
    assert len(bm.match_prefix([1, 2, 3, 4, 5, 6, 7, 8])) == 1   # 最后一个 token 总要算


def test_forced_collision_is_never_served():
    """哈希只有 1 个值：每个键都碰撞；核对 token 和父块，所以别的提示的块永远不会被当成命中。"""
    bm = BlockManager(16, 4, hash_fn=lambda parent, toks: 0)
    a, _ = admit(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert bm.match_prefix([1, 2, 3, 5, 0]) == []
    assert bm.match_prefix([9, 9, 9, 9, 5, 6, 7, 8, 0]) == []
    assert bm.collisions == 2
    assert bm.match_prefix([1, 2, 3, 4, 0]) == a.block_table[:1]


def test_forced_collision_in_the_engine_keeps_every_request_exact():
    cfg = LMConfig(max_seq=48)
    P = init_params(cfg, 3)
    m = TransformerLM(P, cfg)
    rng = np.random.default_rng(0)
    prompts = [[int(t) for t in rng.integers(0, cfg.vocab, 13)] for _ in range(5)]
    prompts += [prompts[0][:8] + [1, 2, 3, 4, 5]]
    eng = LLMEngine(P, cfg, 20, block_size=4, max_num_batched_tokens=16,
                    hash_fn=lambda parent, toks: hash((parent, toks)) % 4)
    out = eng.generate(prompts, 8, seed=2)
    for i, p in enumerate(prompts):
        assert out[i] == [int(t) for t in autoregressive_generate(m, p, 8, 0.0, np.random.default_rng(2 + i))]
    assert eng.bm.collisions > 0 and eng.bm.hits >= 1     # 碰撞发生过、没被当成命中；真的命中照样命中


def test_ref0_cached_blocks_stay_until_needed_then_lru_first():
    bm = BlockManager(4, 2)
    a, _ = admit(bm, [1, 2, 3])                  # 块 0（满，缓存）、块 1
    bm.free(a)                                    # 从尾到头放回：1, 0
    assert bm.num_free_blocks == 4
    assert bm.match_prefix([1, 2, 9]) == [0]      # 计数为 0 仍能命中
    b, _ = admit(bm, [5, 6, 7, 8, 9])             # 要 3 块：2、3、1（最久没用的先拿），块 0 留着
    assert sorted(b.block_table) == [1, 2, 3]
    assert bm.match_prefix([1, 2, 9]) == [0]
    bm.free(b)
    c, _ = admit(bm, [7, 7, 7, 7, 7, 7, 7])       # 4 块：块 0 也被挤掉
    assert bm.match_prefix([1, 2, 9]) == []
    bm.free(c)
    assert sum(bm.pool.ref) == 0 and bm.num_free_blocks == 4


def test_shared_block_is_not_freed_while_another_request_uses_it():
    """回归：一个共享前缀的请求先结束时，它放掉的共享块若被放回空闲表，新来的请求会覆盖另一个请求还在看的 KV。"""
    cfg = LMConfig(max_seq=32)
    P = init_params(cfg, 4)
    m = TransformerLM(P, cfg)
    shared = list(range(10, 22))                  # 3 个满块
    prompts = [shared + [1], shared + [2, 3]] + [[int(t) for t in np.random.default_rng(k).integers(0, 64, 12)]
                                                  for k in range(4)]
    eng = LLMEngine(P, cfg, 16, block_size=4, max_num_batched_tokens=64, max_num_seqs=8)
    eng.add_request(prompts[0], 2, seed=0)        # 第二步结束
    eng.step()
    eng.add_request(prompts[1], 6, seed=1)        # 命中 0 号请求的 3 个满块；0 号结束后它还在用
    eng.step()
    assert eng.bm.hits == 3 and eng.requests[0].finish_reason == "length"
    assert [eng.bm.pool.ref[i] for i in eng.requests[1].block_table[:3]] == [1, 1, 1]
    for k in range(2, 6):
        eng.add_request(prompts[k], 2, seed=k)    # 共要 16 块：空闲的 12 块用完后，不能拿到共享的块
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.requests[1].output == [int(t) for t in autoregressive_generate(m, prompts[1], 6, 0.0,
                                                                              np.random.default_rng(1))]
    assert eng.num_free_blocks == 16


def test_chain_hash_is_deterministic():
    assert chain_hash(None, (1, 2)) == chain_hash(None, (1, 2)) != chain_hash(0, (1, 2))


def test_paging_simulation_uses_the_engines_pool():
    """课程里只有一个块池：paging_lab 的模拟（07）从同一个 BlockPool 拿块、放块；它的空闲数每一步都和自己的账对得上。"""
    import paging_lab
    import block_manager_lab
    assert paging_lab.BlockPool is block_manager_lab.BlockPool
    s = paging_lab.simulate_kv_allocation([40, 70, 90, 30], [30, 50, 20, 60], 160, "paged", block=16,
                                          shared_prefix=20, watermark=0.0)
    assert s["preempted"] > 0 and s["max_held"] <= s["pool"]


def test_pool_take_skips_blocks_revived_by_a_hit():
    """惰性删除：计数为 0 的块被命中（incref）后，它在空闲队列里的旧条目失效，取块时跳过。"""
    pool = BlockPool(3)
    pool.take_many(3)
    pool.decref_many([0, 1, 2])
    pool.incref(1)                       # 缓存命中：1 号离开空闲表
    assert pool.free == [0, 2] and pool.num_free == 2
    assert [int(i) for i in pool.take_many(2)] == [0, 2]
    pool.decref(1)
    pool.decref(0)
    assert pool.free == [1, 0]
    pool.check()
