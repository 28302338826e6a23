"""
停止 token 落在一轮**被接受的草稿**里的时候：链（decode_lab.speculative_generate）、自适应（lookup_lab）、
树（tree_lab）三个生成器都必须把输出截在第一个停止 token 上（它是最后一个返回的 token），之后不再开新的一轮。

做法：T = 0、目标自己当草稿——草稿的 argmax 就是目标的 argmax，每一轮的草稿全部被接受，所以停止 token 只要不是
一轮的最后一个（额外的）token，它后面就还有同一轮里被接受的 token。期望值不经过被测的生成器：
autoregressive_generate 不带 stop 的贪心输出，在测试里截到第一个停止 token（含它）。
（tests/test_real_model_lab.py 的 test_stop_token_is_returned_and_ends_generation 用前 1 层当草稿，在那里没有一个
草稿被接受：它查不出少了截断的生成器。）
greedy_lab 的精确轮次（greedy_rounds / lookup_rounds / tree_rounds）不接受停止 token：没有要测的截断。
回归：tree_speculative_generate 去掉截断时整个测试集照样通过（停止 token 在一条被接受的路径里时返回 [4, 4, 4, 4]
而不是 [4]）。
"""
import numpy as np
import pytest

from context_memo import ContextMemoLM
from decode_lab import TransformerLM, autoregressive_generate, speculative_generate
from lookup_lab import PromptLookup, speculative_generate_adaptive
from transformer_lab import LMConfig, init_params
from tree_lab import tree_speculative_generate

CFG = LMConfig(name="stop", vocab=37, d_model=24, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=6, d_ff=48,
               max_seq=96, head_gain=2.0)
PROMPT = [3, 17, 5, 29]
N_NEW = 40


@pytest.fixture(scope="module")
def target():
    """
    float64 的小模型（init_params 的默认精度）和它不带 stop 的贪心续写（用原模型算）。
    生成器拿到的是同一个模型按上下文记住 logits 的版本（tests/context_memo.py：带缓存、回滚、树形遮罩的每一行 ==
    一次算完这一行能看到的 token，只差舍入）：这里要查的是截断，不是缓存（缓存由 test_decode_lab 和
    test_decode_lab_trees 在原模型上逐行核对）；几十次生成走的是同几段上下文，每段只算一次前向。
    每个测试的第一条断言照样核对：它的输出 == 原模型的贪心。
    """
    base = TransformerLM(init_params(CFG, seed=0), CFG, "目标")
    greedy = autoregressive_generate(base, PROMPT, N_NEW, 0, np.random.default_rng(0)).tolist()
    assert len(set(greedy)) > 8                         # 有足够多不同的 token 可以当停止 token
    return ContextMemoLM(base), greedy


def _cut(greedy, stop):
    """测试自己的期望值：贪心序列截到第一个停止 token（含它）。"""
    return greedy[:greedy.index(stop) + 1]


def _inside_cases(greedy, accepted):
    """
    不带 stop 跑一次得到的每轮接受个数 -> 停止 token 的候选：它第一次出现在某一轮被接受的草稿里、
    而且同一轮里它后面还有 token（不截断就会多出来）。
    """
    firsts = {}
    for i, t in enumerate(greedy):
        firsts.setdefault(t, i)
    out, start = [], 0
    for a in accepted:
        for t, i in firsts.items():
            if start <= i < start + a:                  # 第 i 个是这一轮被接受的草稿（不是最后那个修正 / 额外的 token）
                out.append(t)
        start += a + 1
    return out


def _chain(g):
    return lambda m, s: speculative_generate(m, m, PROMPT, N_NEW, g, 0, np.random.default_rng(1), stop=s)


def _adaptive(g, g_max=None):
    return lambda m, s: speculative_generate_adaptive(m, m, PROMPT, N_NEW, g, 0, np.random.default_rng(1),
                                                      gamma_max=g_max, stop=s)


def _tree(branching):
    return lambda m, s: tree_speculative_generate(m, m, PROMPT, N_NEW, branching, 0, np.random.default_rng(1),
                                                  stop=s)


# 名字 -> (生成器, 每轮的草稿深度；None = 看 stats["drafted"])
GENERATORS = {"链 γ = 1": (_chain(1), 1), "链 γ = 3": (_chain(3), 3), "链 γ = 5": (_chain(5), 5),
              "自适应 γ 固定 4": (_adaptive(4), None), "自适应 γ 2→8": (_adaptive(2, 8), None),
              "树 (1, 1, 1)": (_tree((1, 1, 1)), 3), "树 (2, 1, 1)": (_tree((2, 1, 1)), 3),
              "树 (3, 2)": (_tree((3, 2)), 2)}


@pytest.mark.parametrize("name", list(GENERATORS))
def test_a_stop_inside_accepted_drafts_is_the_last_token_returned(target, name):
    m, greedy = target
    gen, depth = GENERATORS[name]
    full, st = gen(m, None)
    assert full.tolist() == greedy                       # T = 0：输出就是贪心序列
    depths = st["drafted"] if depth is None else [depth] * len(st["accepted"])
    assert st["accepted"][:-1] == depths[:-1]            # 目标自己当草稿：每轮的草稿全部被接受（最后一轮可能被 n_new 截短）
    stops = _inside_cases(greedy, st["accepted"])
    assert len(stops) >= 3                               # 要测的情形真的出现了：停止 token 后面同一轮还有被接受的 token
    for s in stops[:5]:                                  # 前 5 个就够（每个都是一次完整的生成）
        want = _cut(greedy, s)
        out, st_s = gen(m, s)
        assert out.tolist() == want, (name, s)
        assert out[-1] == s
        assert sum(a + 1 for a in st_s["accepted"][:-1]) < len(want)     # 停下以后没有再开新的一轮
        assert st_s["target_calls"] == len(st_s["accepted"])


def test_prompt_lookup_stops_at_the_first_stop_token(target):
    """
    prompt lookup 的草稿（照抄前文）：提示里放进贪心序列的前 18 个 token，续写里有重复的片段被照抄、被接受；
    停止 token 落在被接受的草稿里的情形也要截断。
    """
    m, greedy = target
    prompt = PROMPT + greedy[:18]
    cont = autoregressive_generate(m, prompt, 30, 0, np.random.default_rng(0)).tolist()

    def gen(s):
        return speculative_generate_adaptive(m, PromptLookup(2), prompt, 30, 2, 0, np.random.default_rng(1),
                                             gamma_max=8, stop=s)
    full, st = gen(None)
    assert full.tolist() == cont
    assert len(_inside_cases(cont, st["accepted"])) >= 3   # 停止 token 落在被接受的草稿里、后面还有 token 的情形
    for s in set(cont):
        assert gen(s)[0].tolist() == _cut(cont, s), s


def test_stop_as_a_list_and_a_stop_never_drawn(target):
    """几个停止 token：截在最先出现的那个上；一个从来抽不到的停止 token 不改变输出。"""
    m, greedy = target
    a, b = greedy[5], greedy[12]
    want = greedy[:min(greedy.index(a), greedy.index(b)) + 1]
    never = next(t for t in range(CFG.vocab) if t not in greedy)
    for name, (gen, _) in GENERATORS.items():
        assert gen(m, [b, a])[0].tolist() == want, name
        assert gen(m, never)[0].tolist() == greedy, name
