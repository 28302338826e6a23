"""
lecture05/11_heterogeneous_measured.py：每个印出来的数都按独立写的公式重算（不调用脚本的 tok_s），
观察里的数就是演示返回的数。读成对运行那一次存下的结果（conftest.script_results），不在测试进程里再跑演示。
"""
import numpy as np
import pytest

from conftest import load_script, script_demo_text, script_results, unwrap
from runner_lab import load_calibration

REL = "lecture05/11_heterogeneous_measured.py"
CAL = load_calibration("heterogeneous")["constants"]
PIPE = load_calibration("disaggregation")["constants"]["pipe_bytes_per_s"]


@pytest.fixture(scope="module")
def res():
    return script_results(REL)


@pytest.fixture(scope="module")
def s11():
    return load_script(REL)


def test_demo1_bytes_are_the_protocols_byte_counts(res):
    r = res["demo1"]
    for V in (512, 49_152, 128_256):
        for g in (1, 4, 8):
            row = r[(V, g)]
            assert row["point_mass"] == 4 * g + 4 + 4                       # γ 个 id → ；个数 + token ←
            assert row["lazy_acc"] == g * (4 + 8) + 32 + 4 + 4 + 32          # id + q_i(x_i) + 状态 → ；个数 + token + 状态 ←
            assert row["lazy_rej"] == g * (4 + 8) + 32 + 4 + 4 + V * 8 + 32  # 拒绝：p_n 回来，修正 token 搭下一轮过去
            assert row["full_q"] == 4 * g + g * V * 8 + 32 + 4 + 4 + 32
            assert row["full_s"] == row["full_q"] / PIPE
    assert res["demo1"]["f32_per_tok"] == 196_608
    text = unwrap(script_demo_text(REL, 1))
    smol = r[(49_152, 4)]
    assert f"{smol['lazy_rej']:,} 字节" in text and f"{smol['full_s'] / 10e-6:.0f} 倍" in text
    assert r["feat_bytes"] == 576 * 8                                   # SmolLM2 的 d_model，float64
    assert f"float64 {576 * 8:,} 字节" in text and f"的 {576 * 8 / smol['lazy_acc']:.0f} 倍" in text


def _eq1(a, g):
    return sum(a ** i for i in range(g + 1))


def _overlap_expected(a, g, ow):
    """重叠一轮：接受 k < γ 个（概率 α^k (1 − α)）前进 k + 1 个、再草稿 γ 个；全部接受（α^γ）前进 γ 个。"""
    td, tv = CAL["draft_ms"] / 1e3, CAL["verify_ms"][g] / 1e3
    base = max(g * td, 2 * ow + tv)
    toks = sum((k + 1) * a ** k * (1 - a) for k in range(g)) + g * a ** g
    t = a ** g * base + (1 - a ** g) * (base + g * td)
    return toks / t


def test_demo2_tokens_per_second_follow_the_round_accounts(res, s11):
    r = res["demo2"]
    a = r["alpha"]
    td, t1 = CAL["draft_ms"] / 1e3, CAL["target_ms"] / 1e3
    assert 0 < a < 1 and r["c"] == td / t1 and r["ar"] == 1 / t1
    links = {"没有链路": 0.0, "本机回环": CAL["rtt_p50_s"] / 2, "+100 µs": CAL["rtt_delay_100us_p50_s"] / 2,
             "+1 ms": CAL["rtt_delay_1ms_p50_s"] / 2}
    for label, (g_best, v_best) in r["best"].items():
        if label == "种子 05":
            vals = [_eq1(a, g) / (g * td + t1 + 2 * 10e-6) for g in range(1, 9)]
        elif label == "同设备":
            vals = [_eq1(a, g) / (g * td + CAL["verify_ms"][g] / 1e3) for g in range(1, 9)]
        else:
            name, mode = label.split(" · ")
            ow = links[name]
            if mode == "拆开":
                vals = [_eq1(a, g) / (g * td + 2 * ow + CAL["verify_ms"][g] / 1e3) for g in range(1, 9)]
            else:
                vals = [_overlap_expected(a, g, ow) for g in range(1, 9)]
        k = int(np.argmax(vals))
        assert (g_best, v_best) == (k + 1, pytest.approx(vals[k], rel=1e-12)), label
    assert r["g1"][1] == pytest.approx(_overlap_expected(a, 1, links["本机回环"]), rel=1e-12)


def test_demo2_alpha_is_the_mean_of_sum_min_p_q_on_the_targets_own_text(s11):
    """
    α 重算：在脚本量 α 的那段文本上逐位置 Σ min(p, q)（p、q 用 softmax 直接算），再取平均。
    文本读脚本那次运行存下的（res["demo2"]["text"]），先核对它确实是目标自己 T = 1 采样的：目标在整段上一次前向
    （teacher forcing；α 本来就要这些 logits），每个新位置的 token == 用那个提示的种子（i + 1）第 j 个均匀数在这一行的
    softmax 上 CDF 反查（autoregressive_generate 的抽法）。一次前向和逐个带缓存生成只差求和的舍入（1e-16 量级），
    一个均匀数落在这么近的 CDF 边界上的机会可以忽略（万一，断言红而不是绿）。以前在这里把 2 × 64 个 token
    重新逐个采样（64 次前向），现在一次。
    """
    from decode_lab import adjust
    from split_models_lab import build_split_model
    from transformer_lab import sample_inverse_cdf
    t, d = build_split_model("split:0"), build_split_model("split-draft:0")
    res = script_results(REL)["demo2"]
    a0, a1, toks = res["alpha0"], res["alpha"], np.asarray(res["text"])
    prompts = s11.TEXT_PROMPTS
    assert toks.shape == (len(prompts), len(prompts[0]) + s11.TEXT_LEN)
    lp, lq = t.full_logits(toks), d.full_logits(toks)
    for i, p in enumerate(prompts):
        assert list(toks[i, :len(p)]) == list(p)
        rng = np.random.default_rng(i + 1)
        drawn = [int(sample_inverse_cdf(adjust(lp[i, len(p) - 1 + j], 1.0), rng.random())) for j in range(s11.TEXT_LEN)]
        assert drawn == list(toks[i, len(p):]), f"第 {i} 段不是目标自己（种子 {i + 1}）采样的"
    p = np.exp(lp - lp.max(-1, keepdims=True))
    q = np.exp(lq - lq.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    q /= q.sum(-1, keepdims=True)
    assert abs(np.minimum(p, q).sum(-1).mean() - a1) < 1e-12     # 两种 softmax 的舍入差几个 ulp
    assert np.mean(lp.argmax(-1) == lq.argmax(-1)) == a0


def test_demo2_observations_cite_the_returned_numbers(res):
    r = res["demo2"]
    text = unwrap(script_demo_text(REL, 2))
    co, s5 = r["best"]["同设备"], r["best"]["种子 05"]
    assert f"最好的 γ = {co[0]}、{co[1]:.0f} token/s，是自回归的 {co[1] / r['ar']:.2f} 倍" in text
    assert f"最好的 γ = {s5[0]}、{s5[1]:.0f} token/s（{s5[1] / r['ar']:.2f} 倍）" in text
    lo, ov = r["best"]["本机回环 · 拆开"], r["best"]["本机回环 · 重叠"]
    assert f"（差 {ov[1] / lo[1] - 1:+.2%}）" in text
    assert f"γ = 1 时重叠只有 {r['g1'][1]:.0f} token/s（不重叠 {r['g1'][0]:.0f}）" in text
    for name in ("plain", "overlap"):
        toks, st = r["run"][name]
        assert len(toks) == 24 and st["target_calls"] == len(st["accepted"])


def test_demo3_verdicts_follow_the_stated_criteria(res):
    r, r1, r2 = res["demo3"], res["demo1"], res["demo2"]
    verdicts = [ok for *_, ok in r["checks"]]
    ow = CAL["rtt_p50_s"] / 2
    vr = [CAL["verify_ms"][n - 1] / CAL["target_ms"] for n in range(2, 10)]
    gain = r2["best"]["本机回环 · 重叠"][1] / r2["best"]["本机回环 · 拆开"][1]
    assert verdicts == [5e-6 <= ow <= 20e-6, max(vr) < 1.1, r1[(49_152, 4)]["full_s"] < 10e-6,
                        r2["best"]["种子 05"][0] == r2["best"]["同设备"][0], gain < 1.01]
    assert r["verify_ratios"] == pytest.approx(vr, rel=1e-12)
    text = unwrap(script_demo_text(REL, 3))
    assert f"{min(vr):.2f}–{max(vr):.2f} 倍" in text and f"只差 {gain - 1:+.2%}" in text
    assert "04 演示 5 观察 2" in text and "04 演示 3 观察 3" in text


def test_lecture05_04_points_here_for_seed05s_round_account():
    """种子 05 的改正只有一个家：04 演示 5 的清单指到这里的演示 3，这里不重复 04 的改正（只指过去）。"""
    text = unwrap(script_demo_text("lecture05/04_sram_accelerators.py", 5))
    assert "11_heterogeneous_measured.py 演示 3" in text
