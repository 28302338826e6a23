"""
第 6 讲 09（token 树）：演示函数返回的数和独立的算法核对——手算的 α_k 和残差、04 脚本自己的 α（measured_alpha）、
链的式 (1)（expected_tokens）、树 (k, 1, …, 1) 的闭式；drafts_lab.build_seed04_models 和 04 脚本的 build_models 逐个数组相同。
"""
import contextlib
import io

import numpy as np
import pytest

from conftest import load_script, script_results, script_stdout
from seed04_models import built_by
from decode_lab import acceptance_beta, adjust, NGramLM, residual_distribution
from spec_math_lab import expected_tokens

S09 = load_script("lecture06/09_token_trees.py")
S04 = load_script("lecture06/04_spec_decode_speedup.py")


def quiet(fn, *args):
    with contextlib.redirect_stdout(io.StringIO()):
        return fn(*args)


@pytest.fixture(scope="module")
def models():
    return built_by(S09.build_seed04_models)          # 整个会话只建一次（tests/seed04_models.py）


@pytest.fixture(scope="module")
def r1():
    """演示 1 返回的数：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的），不在进程里再跑一遍。"""
    return script_results("lecture06/09_token_trees.py")["r1"]


@pytest.fixture(scope="module")
def r2():
    """
    演示 2 返回的数：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的），不在进程里再跑一遍。
    那次运行的目标模型就是 build_seed04_models 的（test_builder_matches_seed04_construction 核对它）。
    """
    return script_results("lecture06/09_token_trees.py")["r2"]


@pytest.fixture(scope="module")
def r3():
    """演示 3 返回的数：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的），不在进程里再跑一遍。"""
    return script_results("lecture06/09_token_trees.py")["r3"]


@pytest.fixture(scope="module")
def r4():
    """演示 4 返回的数：取自脚本自己的运行（test_scripts 跑的那一次，console.save_results 存下的），不在进程里再跑一遍。"""
    return script_results("lecture06/09_token_trees.py")["r4"]


def test_builder_matches_seed04_construction(models):
    target, drafts = models
    t04, d04 = built_by(S04.build_models)
    assert list(drafts) == list(d04)
    pairs = [(target, t04)] + [(drafts[n], d04[n]) for n in d04]
    for a, b in pairs:
        assert type(a) is type(b) and a.name == b.name
        if isinstance(a, NGramLM):
            assert np.array_equal(a.table, b.table)
            continue
        assert a.cfg == b.cfg
        assert np.array_equal(a.params["embed"], b.params["embed"])
        assert np.array_equal(a.params["lm_head"], b.params["lm_head"])
        assert len(a.params["layers"]) == len(b.params["layers"])
        for La, Lb in zip(a.params["layers"], b.params["layers"]):
            assert La.keys() == Lb.keys() and all(np.array_equal(La[k], Lb[k]) for k in La)


# ---------------------------------------------------------------------------
# 演示 1：手算
# ---------------------------------------------------------------------------
def test_demo1_outputs_are_p_and_k1_is_the_ordinary_rule(r1):
    for name, _, _ in S09.CASES:
        assert r1[name]["err"] < S09.ENUM_BOUND and r1[name]["k1_gap"] < S09.ENUM_BOUND


def test_demo1_alpha_k_hand_worked(r1):
    """
    一般情形：β₁ = 0.75，残差是 token 0 的 one-hot，之后每个候选 β = q(0) = 0.25：α_k = 1 − 0.25·0.75^(k−1)。
    残差每次都变：β = 0.6, 0.35, 0.1, 0.1（残差 (0.25, 0.75)、(0, 1)、(0, 1)）。q one-hot：α_k = p(1) = 0.2。
    """
    ks = S09.KS
    assert r1["一般情形"]["alphas"] == pytest.approx([1 - 0.25 * 0.75 ** (k - 1) for k in ks], abs=1e-15)
    betas = [0.6, 0.35, 0.1, 0.1]
    expect = [1 - np.prod([1 - b for b in betas[:k]]) for k in ks]
    assert r1["残差每次都变"]["alphas"] == pytest.approx(expect, abs=1e-15)
    assert r1["q one-hot（T = 0）"]["alphas"] == pytest.approx([0.2] * len(ks), abs=1e-15)
    assert r1["p == q"]["alphas"] == pytest.approx([1.0] * len(ks), abs=1e-15)
    assert r1["支撑不相交"]["alphas"] == [0.0] * len(ks)
    hand = [[0.6, 0.4, 0, 0], [0.25, 0.75, 0, 0], [0, 1, 0, 0], [0, 1, 0, 0]]
    assert np.allclose(r1["residuals"], hand, atol=1e-15)


def test_demo1_increments_shrink_in_the_cases_shown(r1):
    for name in ("一般情形", "草稿过于自信", "残差每次都变"):
        a = r1[name]["alphas"]
        inc = np.diff(a)
        assert np.all(inc > 0) and np.all(np.diff(inc) < 0), name


# ---------------------------------------------------------------------------
# 演示 2
# ---------------------------------------------------------------------------
def test_demo2_tree_attention_and_kept_path(r2):
    assert r2["max_delta"] < S09.TREE_BOUND
    assert r2["kv_gap"] < S09.TREE_BOUND and r2["step_gap"] < S09.TREE_BOUND
    assert r2["n_nodes"] == 2 + 4 + 4
    n0 = S09.PROMPT_LEN
    # 树 (2, 2, 1) 的节点按层：0, 1 | 2, 3（0 的孩子）, 4, 5（1 的孩子）| 6..9；节点 8 的路径 1 → 4 → 8
    assert r2["slots"] == [n0 + 1, n0 + 4, n0 + 8]
    assert r2["positions"] == [n0] * 2 + [n0 + 1] * 4 + [n0 + 2] * 4
    assert r2["n_leaves"] == 4


def test_demo2_ledger_tree_vs_paths_vs_batch(models, r2):
    """
    issue 26 第 16 条：旧的观察 3 只拿树和"每个叶子的路径单独一次前向"（读 4 遍权重）比。把 4 条路径拼成一批、一次前向
    也只读 1 遍权重：树比批省下的是共享前缀上重复算的位置（12 − 10 = 2），不是读权重。这里用账本另算一遍：
    批的前向自己喂一次（[4, 3] 的 token），位置数 = 矩阵乘法 FLOPs ÷ 每个位置的（参数个数 × 2）。
    """
    from ledger_lab import Counter, MATMUL_OPS
    from quant_lab import QCFG
    target = models[0]
    led = r2["ledger"]
    per_pos = 2 * QCFG.to_model_config().matmul_params()
    w_once = 2 * QCFG.to_model_config().matmul_params()                  # BF16：每个参数 2 字节，读一遍
    assert [(v["forwards"], v["positions"], v["w"]) for v in led.values()] == [
        (1, 10, w_once), (4, 12, 4 * w_once), (1, 12, w_once)]
    # 批：独立地喂一次（token 随便取，账本只看形状）
    cb, c = target.new_cache(4), Counter()
    target.forward(np.zeros((4, S09.PROMPT_LEN), dtype=int), cb)
    target.forward(np.ones((4, 3), dtype=int), cb, c)
    assert c.total("flops", MATMUL_OPS) == 12 * per_pos and c.total("w", MATMUL_OPS) == w_once
    assert led["batch"]["w"] == led["tree"]["w"]                           # 旧文字："读 4 遍权重"只对逐条前向成立
    assert led["batch"]["positions"] - led["tree"]["positions"] == 2
    assert r2["path_gap"] < S09.TREE_BOUND
    # 演示 4 的树 (2, 1, …, 1)，16 个节点：两条 8 个节点的路径，没有共享节点
    assert r2["demo4_tree"] == (16, 2, 16)


# ---------------------------------------------------------------------------
# 演示 3
# ---------------------------------------------------------------------------
def test_demo3_alpha_1_is_seed04s_alpha(models, r3):
    target, drafts = models
    toks = S04.sample_tokens(target.params, S04.QCFG, n_seq=8, length=64, seed=0)
    for name in ("INT4 量化的自己", "二元语法表"):   # α 最高和最低的两个（04 脚本的函数每次都重算目标模型）
        assert r3["alpha_k"][name][1] == pytest.approx(S04.measured_alpha(target, drafts[name], toks, 1.0), abs=1e-12)
    for name in drafts:
        assert r3["alpha_k"][name]["alpha"] == pytest.approx(r3["alpha_k"][name][1], abs=1e-12)


def test_demo3_alpha_2_by_a_second_code_path(models, r3):
    """α_2 = E[β₁ + (1 − β₁)·β₂]，β₂ 用 residual_distribution 一个位置一个位置地算（不用向量化的 multi_draft_acceptance）。"""
    target, drafts = models
    toks = S04.sample_tokens(target.params, S04.QCFG, n_seq=8, length=64, seed=0)
    p = adjust(target.full_logits(toks), 1.0).reshape(-1, S04.QCFG.vocab)
    dr = drafts["二元语法表"]
    q = adjust(dr.table[toks], 1.0).reshape(-1, S04.QCFG.vocab)
    vals = []
    for pi, qi in zip(p, q):
        b1 = float(acceptance_beta(pi, qi))
        b2 = float(acceptance_beta(residual_distribution(pi, qi), qi))
        vals.append(b1 + (1 - b1) * b2)
    assert r3["alpha_k"]["二元语法表"][2] == pytest.approx(np.mean(vals), abs=1e-12)


def test_demo3_observations(r3):
    A = r3["alpha_k"]
    for name in A:
        a = [A[name][k] for k in S09.ALPHA_KS]
        assert np.all(np.diff(a) > 0), name
    gains = {n: A[n][2] - A[n][1] for n in A}
    assert gains["二元语法表"] > gains["只用前 1 层"] > gains["只用前 3 层"] > gains["INT4 量化的自己"]
    assert r3["greedy_same"] == r3["greedy_total"] == 4 * S09.GREEDY_PROMPTS * S09.GREEDY_NEW


# ---------------------------------------------------------------------------
# 演示 4
# ---------------------------------------------------------------------------
def _closed_form(A, name, br):
    """链：式 (1)；树 (k, 1, …, 1)（深 D）：1 + α_k·(1 − α_1^D)/(1 − α_1)。"""
    a1 = A[name][1]
    if all(b == 1 for b in br):
        return expected_tokens(a1, len(br))
    return 1 + A[name][br[0]] * (1 - a1 ** len(br)) / (1 - a1)


def test_demo4_predictions_match_closed_forms(r3, r4):
    A = r3["alpha_k"]
    for (name, br), e in r4["pred"].items():
        assert e == pytest.approx(_closed_form(A, name, br), abs=1e-12), (name, br)


def test_demo4_where_trees_win(r3, r4):
    A = r3["alpha_k"]
    wins = []
    for name in A:
        for b in S09.BUDGETS:
            chain = _closed_form(A, name, (1,) * b)
            best_tree = max(_closed_form(A, name, br) for br in S09.shapes(b)[1:])
            if best_tree > chain:
                wins.append((name, b, best_tree / chain))
    assert sorted((n, b) for n, b, _ in wins) == sorted(r4["wins"])
    assert {n for n, _, _ in wins} <= {"二元语法表", "只用前 1 层"}          # 只在 α 低的草稿上
    assert all(b > S09.BUDGETS[0] for _, b, _ in wins)                     # 位置少时链都更好
    assert r4["win_ratio"] == pytest.approx(max(r for _, _, r in wins), abs=1e-12)
    assert round(100 * (r4["win_ratio"] - 1)) == 9
    lo = "二元语法表"
    assert r4["lim_tree"] == pytest.approx(1 + A[lo][2] / (1 - A[lo][1]), abs=1e-12)
    assert 1 / (1 - A[lo][1]) < r4["lim_tree"]                              # 树的极限高过链的极限


def test_demo4_measurement_agrees_with_prediction(r4):
    assert r4["zmax"] < 3
    for (name, br), m in r4["meas"].items():
        assert abs(m["z"]) < 3 and m["rounds"] * m["mean"] >= S09.LOOP_PROMPTS * S09.LOOP_NEW, (name, br)


def test_demo4_measured_cells_by_direct_calls_and_statistics(models, r3, r4):
    """实测一格（二元语法表、链 γ = 16）直接调用 speculative_generate 另跑，均值、标准误用 statistics 另算；
    观察 4 的"最多差 1.2 个标准误"按每格的均值、标准误和闭式的预测另算。"""
    import statistics
    from decode_lab import speculative_generate
    target, drafts = models
    big = S09.BUDGETS[-1]
    prompts = S04.sample_tokens(target.params, S04.QCFG, n_seq=S09.LOOP_PROMPTS, length=16, seed=11)
    produced = []
    for i, pr in enumerate(prompts):
        _, st = speculative_generate(target, drafts["二元语法表"], pr, S09.LOOP_NEW, big, 1.0,
                                     np.random.default_rng(100 + i))
        produced += [a + 1 for a in st["accepted"]]
    m = r4["meas"][("二元语法表", (1,) * big)]
    assert m["rounds"] == len(produced) == 306
    assert m["mean"] == pytest.approx(statistics.mean(produced), rel=1e-12)
    assert m["se"] == pytest.approx(statistics.stdev(produced) / len(produced) ** 0.5, rel=1e-12)
    A = r3["alpha_k"]
    z = [(v["mean"] - _closed_form(A, name, br)) / v["se"] for (name, br), v in r4["meas"].items()]
    assert r4["zmax"] == pytest.approx(max(abs(x) for x in z), rel=1e-9) and round(r4["zmax"], 1) == 1.2


def test_tree_claims_are_scoped_to_independent_candidates():
    """issue 19 第 15 条：「α 高时链更好」「贪心时树没用」只对独立、有放回地抽的候选成立；
    取前 k 个不同候选的树（SpecInfer 的展开、Medusa、EAGLE-2）在 T = 0 时也能赢，观察要说出来。"""
    text = script_stdout("lecture06/09_token_trees.py")
    assert "贪心解码时**独立、有放回地**抽候选的树没有用处" in text
    assert "贪心解码时独立抽候选的树没有用处" not in text
    assert "只在这里的条件下成立：候选独立、有放回地抽，形状只有 (k, 1, …, 1)，每次前向 5–17 个位置" in text
    assert "取前 k 个不同候选的树不会抽到重复的候选，T = 0 时也能赢" in text


def test_demo2_batch_shares_prompt_blocks_cost_is_reading_them_per_row(r2):
    """issue 35 第 16 条：旧句子说批里"每一行各存一份提示的 KV cache"——用引用计数的分页块时各行共享提示的块；
    没有 cascade 核时多出来的是注意力为每一行把提示的 K、V 读一遍。"""
    from conftest import script_stdout
    from quant_lab import QCFG
    kv = S09.PROMPT_LEN * 2 * QCFG.n_layers * QCFG.n_kv_heads * QCFG.head_dim * 2     # K、V，BF16，手写
    assert r2["kv_prompt"] == kv
    text = script_stdout("lecture06/09_token_trees.py")
    assert "还有批里每一行各存一份提示的 KV cache" not in text and "树省下的是提示的 KV 只存一份" not in text
    assert "各行的块表指向同一组提示的块" in text
    assert (f"多出来的是注意力为每一行把提示的 K、V 读一遍：{S09.PROMPT_LEN} 个位置、{S09.fmt_bytes(kv)}（BF16），"
            f"拼成一批读 {r2['n_leaves']} 遍，树一次前向读 1 遍") in text
    assert r2["n_leaves"] == 4          # (2, 2, 1) 的树：4 个叶子
