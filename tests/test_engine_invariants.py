"""
第 5 讲引擎的不变式，各用一个直接、快的测试（小的随机模型 LMConfig(max_seq=48)）：

- 链式哈希的键带着父块的键：A = [1,2,3,4 | 5,6,7,8 | 0]、B = [9,9,9,9 | 5,6,7,8 | 0]，依次送 A、B、B，
  第三个命中 2 块、0 次碰撞（键丢了父块时：1 块命中、1 次碰撞——第二块的键撞上 A 的第二块）；
- 前缀缓存永远不交出前缀不同的块：哈希强行碰撞（只看本块 token 的哈希；常数哈希）时，输出照样 == 单独生成，
  命中和碰撞的账是手算的数；
- 每一步最多 max_num_seqs 个序列，最多 max_num_batched_tokens 个 token（投机解码时连 γ 个草稿位置一起算）；
- metrics_lab.summarize 的 ITL 是每个请求自己相邻两个 token 的间隔（不是所有请求的 token 时间合在一起排序后的间隔）。
"""
import numpy as np
import pytest

from block_manager_lab import BlockManager
from decode_lab import TransformerLM, autoregressive_generate
from engine_lab import LLMEngine
from transformer_lab import LMConfig, init_params

CFG = LMConfig(max_seq=48)
PARAMS = init_params(CFG, 7)
MODEL = TransformerLM(PARAMS, CFG)
A = [1, 2, 3, 4, 5, 6, 7, 8, 0]
B = [9, 9, 9, 9, 5, 6, 7, 8, 0]


def solo(prompt, n, seed):
    return [int(t) for t in autoregressive_generate(MODEL, prompt, n, 0.0, np.random.default_rng(seed))]


class Req:
    def __init__(self, tokens):
        self.tokens, self.block_table, self.n_cached_blocks = list(tokens), [], 0


def send(bm, tokens):
    """一个请求进来、整段算完、登记写满的块 -> 它命中的块数（不放掉：块一直被用着）。"""
    r = Req(tokens)
    hits = bm.match_prefix(r.tokens)
    assert bm.can_allocate(hits, len(tokens))
    bm.allocate(r, hits, len(tokens))
    bm.commit_full(r, r.tokens, len(tokens))
    return len(hits)


# ---------------------------------------------------------------------------
# 链式哈希：键带着父块的键
# ---------------------------------------------------------------------------
def test_second_send_of_B_hits_both_blocks_after_A_shares_its_second_block():
    """
    回归（变异存活过）：键丢了父块的键时，B 的第二块 5,6,7,8 的键和 A 的第二块相同；B 登记时表里已有 A 的那块（留旧的），
    第三次送 B 时第二块查到 A 的块、父块对不上：算一次碰撞，只命中 1 块。
    """
    bm = BlockManager(16, 4)
    assert [send(bm, A), send(bm, B)] == [0, 0]
    c0 = bm.collisions
    assert send(bm, B) == 2
    assert bm.collisions - c0 == 0


def test_engine_sending_A_B_B_counts_two_hits_on_the_third():
    """同样的 A、B、B 一个接一个送进引擎：第三个请求命中 2 块、没有碰撞，输出 == 单独生成。"""
    eng = LLMEngine(PARAMS, CFG, 16, block_size=4, max_num_batched_tokens=32, max_num_seqs=4)
    hits = []
    for k, p in enumerate((A, B, B)):
        h0 = eng.bm.hits
        assert eng.generate([p], 3, seed=k) == [solo(p, 3, k)]
        hits.append(eng.bm.hits - h0)
    assert hits == [0, 0, 2] and eng.bm.collisions == 0


# ---------------------------------------------------------------------------
# 前缀不同的块永远不会被交出去
# ---------------------------------------------------------------------------
def run_in_turn(eng, prompts, n=4):
    """一个接一个地跑（前一个结束才送下一个）-> 每个的输出、每个命中的块数。"""
    outs, hits = [], []
    for k, p in enumerate(prompts):
        h0 = eng.bm.hits
        outs.append(eng.generate([p], n, seed=k)[0])
        hits.append(eng.bm.hits - h0)
    return outs, hits


def test_block_with_the_same_tokens_under_another_parent_is_not_served():
    """
    哈希只看本块的 token（不看父块）：第三次送 B 时它的第二块 5,6,7,8 查到的是 A 的块——token 一样，但那块的 KV 是接在
    1,2,3,4 后面算的。核对父块，所以不命中（1 块命中、1 次碰撞），输出 == 单独生成；交出去的话 B 的输出会变。
    """
    eng = LLMEngine(PARAMS, CFG, 16, block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
                    hash_fn=lambda parent, toks: hash(tuple(toks)))
    outs, hits = run_in_turn(eng, [A, B, B])
    assert outs == [solo(p, 4, k) for k, p in enumerate((A, B, B))]
    assert hits == [0, 0, 1] and eng.bm.collisions == 1
    assert eng.num_free_blocks == 16


def test_block_with_other_tokens_under_a_colliding_key_is_not_served():
    """
    哈希是常数：每个键都撞。C 的第一块 1,2,3,5 查到 A 的第一块 1,2,3,4（父块都是"没有"）：核对 token，不命中；
    D 和 A 的第一块相同、第二块不同：命中 1 块，第二块查到的是 A 的第一块（表里只留最早的），碰撞。
    """
    C = [1, 2, 3, 5, 5, 6, 7, 8, 0]
    D = [1, 2, 3, 4, 8, 7, 6, 5, 0]
    eng = LLMEngine(PARAMS, CFG, 16, block_size=4, max_num_batched_tokens=32, max_num_seqs=4,
                    hash_fn=lambda parent, toks: 0)
    outs, hits = run_in_turn(eng, [A, C, D])
    assert outs == [solo(p, 4, k) for k, p in enumerate((A, C, D))]
    assert hits == [0, 0, 1] and eng.bm.collisions == 2


# ---------------------------------------------------------------------------
# 每一步的两个上限
# ---------------------------------------------------------------------------
def recorded_schedules(eng):
    """把引擎每一步排出来的段记下来（包一层 scheduler.schedule）-> list，每步一个 [(n, γ)]。"""
    log, orig = [], eng.scheduler.schedule

    def schedule(*a, **kw):
        chunks = orig(*a, **kw)
        log.append([(c.n, c.gamma) for c in chunks])
        return chunks
    eng.scheduler.schedule = schedule
    return log


PROMPTS = [[int(t) for t in np.random.default_rng(k).integers(0, CFG.vocab, n)] for k, n in
           enumerate((5, 11, 3, 9, 2, 7))]


def test_no_step_runs_more_than_max_num_seqs_sequences():
    """6 个短请求一起到、预算和块池都宽：每一步最多 2 个序列（有的步正好 2 个），输出 == 单独生成。"""
    eng = LLMEngine(PARAMS, CFG, 40, block_size=4, max_num_batched_tokens=64, max_num_seqs=2)
    log = recorded_schedules(eng)
    outs = eng.generate(PROMPTS, 3, seed=1)
    assert outs == [solo(p, 3, 1 + i) for i, p in enumerate(PROMPTS)]
    seqs = [len(s) for s in log]
    assert max(seqs) == 2 and [st["seqs"] for st in eng.steps] == seqs


@pytest.mark.parametrize("spec", [False, True])
def test_no_step_schedules_more_than_the_token_budget(spec):
    """
    预算 7 个 token：每一步的段加起来（投机解码时每段再加 γ 个草稿位置）≤ 7，有的步正好 7 个；输出 == 单独生成
    （投机：草稿就是目标模型自己，γ = 2，每一轮都排草稿位置；T = 0，所以输出也 == 贪心）。
    """
    sc = {"method": "draft", "draft_model": MODEL, "num_speculative_tokens": 2} if spec else None
    eng = LLMEngine(PARAMS, CFG, 40, block_size=4, max_num_batched_tokens=7, max_num_seqs=4, speculative_config=sc)
    log = recorded_schedules(eng)
    outs = eng.generate(PROMPTS, 5, seed=2)
    assert outs == [solo(p, 5, 2 + i) for i, p in enumerate(PROMPTS)]
    used = [sum(n + g for n, g in s) for s in log if s]
    assert max(used) == 7
    if spec:
        assert sum(1 for s in log for _, g in s if g) >= 10, "投机解码要真的排过草稿位置"


# ---------------------------------------------------------------------------
# metrics_lab：ITL 在每个请求之内
# ---------------------------------------------------------------------------
def test_summarize_takes_itl_gaps_within_each_request():
    """
    回归（变异存活过）：两个请求的 token 在 1、2、3 s 和 1.5、2.5、3.5 s。每个请求自己的间隔都是 1.0 s，所以 ITL 的
    p50 / p90 / p99 都是 1.0；把两串时间合在一起排序再取间隔会得到 0.5。
    """
    from metrics_lab import summarize

    class R:
        pass
    a, b = R(), R()
    a.arrival, a.token_times = 0.5, [1.0, 2.0, 3.0]
    b.arrival, b.token_times = 1.0, [1.5, 2.5, 3.5]
    s = summarize([a, b])
    assert s["itl"] == {50: 1.0, 90: 1.0, 99: 1.0}
