"""
种子脚本 lecture05/05 的每句话都要和它旁边打印的数对得上。种子的文字是固定的（写死了"约 0.9 ms"、
"144 ms > 41 ms"），这里用实验模块重新算一遍，断言每个说法成立；再从它的输出里核对同样的数。
"""
import pytest

from conftest import load_script, script_stdout
from hw_specs import H100
from llm_math import LLAMA31_70B
from ledger_lab import ATTN_CORE_OPS, MATMUL_OPS, analytic_ops, sum_rows

SEED = "lecture05/05_heterogeneous_spec_decode.py"
FFN_OPS = ("q_proj", "k_proj", "v_proj", "o_proj", "mlp_gate", "mlp_up", "mlp_down", "lm_head")


@pytest.fixture(scope="module")
def seed():
    return load_script(SEED)


def test_seed_uses_h100_sxm5_numbers():
    assert H100.mem_bw == 3.35e12 and H100.peak_flops("bf16") == 989.4e12


def test_gpu_draft_token_is_about_0_9_ms_and_five_drafts_near_two_steps(seed):
    t_gpu = seed.t_draft("gpu")
    assert abs(t_gpu - 0.9e-3) < 0.05e-3                  # "约 0.9 ms"
    assert abs(5 * t_gpu - 4.5e-3) < 0.05e-3              # "草稿 5 个 token（4.5 ms）"
    base = seed.t_target(1)
    assert abs(base - 2.5e-3) < 0.05e-3                   # 普通 decode 一步 ≈ 2.5 ms
    assert abs(2 * base - 5.0e-3) < 0.05e-3               # 两步 ≈ 5.0 ms
    assert 5 * t_gpu < 2 * base                           # "将近"两步


def test_sram_draft_is_tens_of_microseconds(seed):
    t = seed.t_draft("sram")
    assert 10e-6 <= t < 100e-6


def test_verifying_21_tokens_costs_several_plain_steps(seed):
    assert 3 <= seed.t_target(21) / seed.t_target(1) <= 9


def test_moe_optimum_is_shorter_than_constant_verify(seed):
    alpha = 0.93
    best = {}
    for where in ("gpu", "sram"):
        for moe in (True, False):
            sp = [(seed.t_target(1) / (seed.round_time(g, where, moe) / seed.tokens_per_round(alpha, g)), g)
                  for g in (1, 2, 3, 5, 8, 10, 15, 20, 30, 40)]
            best[(where, moe)] = max(sp)
    assert best[("gpu", True)][1] < best[("gpu", False)][1]
    assert best[("sram", True)][1] < best[("sram", False)][1]
    assert best[("sram", True)][0] > best[("gpu", True)][0]    # SRAM 草稿：加速比更大
    assert best[("sram", True)][1] > best[("gpu", True)][1]    # 最优草稿更长


def test_blog_table_accepted_counts(seed):
    for gamma, reported, alpha in [(5, 4, 0.926), (10, 7, 0.934), (20, 12, 0.948), (40, 20, 0.962)]:
        assert round(seed.expected_accepted(alpha, gamma)) == reported
    assert seed.expected_accepted(0.962, 40) / 40 == pytest.approx(0.5, abs=0.01)   # "只接受一半"


@pytest.mark.parametrize("B", [16, 64, 256, 1024])
def test_attention_intensity_is_8_and_ffn_intensity_is_B(B):
    a = analytic_ops(LLAMA31_70B, B, 1, 4095, last_only=True)
    assert sum_rows(a, "useful", ATTN_CORE_OPS) / sum_rows(a, "kv", ATTN_CORE_OPS) == 8.0
    assert sum_rows(a, "useful", FFN_OPS) / sum_rows(a, "w", MATMUL_OPS) == B


def test_b1024_compute_144ms_over_weights_41ms():
    a = analytic_ops(LLAMA31_70B, 1024, 1, 4095, last_only=True)
    t_c = sum_rows(a, "useful", FFN_OPS) / H100.peak_flops("bf16")
    t_w = sum_rows(a, "w", MATMUL_OPS) / H100.mem_bw
    assert round(t_c * 1e3) == 144 and round(t_w * 1e3) == 41
    assert t_c > t_w


def test_printed_output_carries_the_same_numbers():
    out = script_stdout(SEED)
    assert "GPU 上 0.897 ms" in out and "SRAM 芯片上 56.7 µs" in out
    assert "普通 decode 一步：2.51 ms" in out
    lines = [l for l in out.splitlines() if l.strip().startswith("1024 ")]
    assert lines and "8.0" in lines[-1] and "144 ms" in lines[-1] and lines[-1].split()[4] == "1024"


def test_seed_structure_matches_llm_math(seed):
    """种子的"每个专家约 2490 万参数、非专家约 15 亿"和第 3 讲的专家公式，对得上 llm_math 的 gpt-oss-120b。"""
    from llm_math import GPT_OSS_120B as m
    assert seed.T_EXPERT_PARAMS == pytest.approx(m.expert_params(), rel=0.001)
    non_expert = m.active_params() - m.n_layers * m.top_k * m.expert_params()
    assert seed.T_DENSE_PARAMS == pytest.approx(non_expert, rel=0.04)                 # "约 15 亿"（精确 15.5 亿）
    for n in (1, 6, 21, 41):
        assert seed.touched_experts(n) == pytest.approx(128 * (1 - (124 / 128) ** n), rel=1e-12)
    out = script_stdout(SEED)
    assert "每层 22 / 62 / 93 个" in out
    assert [round(seed.touched_experts(n)) for n in (6, 21, 41)] == [22, 62, 93]


def test_sram_draft_is_mostly_fixed_overhead(seed):
    """观察 2："几乎只剩固定开销"——SRAM 上一个草稿 token 里 50 µs 是开销，读权重只占约 12%。"""
    assert seed.OVH_SRAM / seed.t_draft("sram") > 0.85


def test_printed_best_gamma_is_the_grid_optimum_and_the_integer_optimum_is_longer(seed):
    """
    种子只试 γ ∈ {1, 2, 3, 5, 8, 10, 15, 20, 30, 40}：它印的 3、5、8、20 是这 10 个里的最优；
    所有整数里是 3、6、9、24（第 5 讲 04 演示 3 的对账表）。GPU 草稿、验证代价不变时种子的加速比就是定理 3.8，
    用 decode_lab.walltime_speedup 独立地算。
    """
    from spec_math_lab import walltime_speedup
    out = script_stdout(SEED)
    block = out.split("每种情况下最好的草稿长度和加速比：")[1].split("观察")[0]
    printed = [int(l.split()[-2]) for l in block.splitlines() if l.strip().endswith("×")]
    assert printed == [3, 5, 8, 20]
    grid = (1, 2, 3, 5, 8, 10, 15, 20, 30, 40)
    c = seed.t_draft("gpu") / seed.t_target(1)
    for g in grid:
        seed_sp = seed.t_target(1) / (seed.round_time(g, "gpu", False) / seed.tokens_per_round(0.93, g))
        assert seed_sp == pytest.approx(walltime_speedup(0.93, g, c), rel=1e-12)

    def best(where, moe, gammas):
        return max(gammas, key=lambda g: (seed.tokens_per_round(0.93, g) / seed.round_time(g, where, moe), -g))
    cases = [("gpu", True), ("gpu", False), ("sram", True), ("sram", False)]
    assert [best(w, m, grid) for w, m in cases] == printed
    assert [best(w, m, range(1, 257)) for w, m in cases] == [3, 6, 9, 24]
