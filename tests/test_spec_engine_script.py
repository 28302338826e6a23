"""
第 6 讲 11_spec_decode_in_engine.py（引擎里的投机解码）：

- 演示 1（玩具；读脚本自己那次运行存下的数，conftest.script_results，不在测试进程里再跑一遍）：每个请求 T = 0 == 贪心、
  == speculative_generate，T = 1 == speculative_generate；几个请求同一步验证；χ² 的计数用测试自己的精确分布重算；
- 06/05 的算法（analytic_break_even）：验证一步的 FLOPs 用账本（lm_head 算在每个位置上）自己算，不用 chunk_counts；
- 演示 2、3 打印的数（从 test_scripts 已经跑过的输出里读，不再跑一遍）：观察里的"不划算的到达率"是吞吐表里第一个
  投机比普通低的那一行；goodput 是达标 ≥ 90% 的最高那一行；还回的块 ≤ 作废的位置。
"""
import re

import numpy as np
import pytest

from conftest import load_script, script_results, script_stdout
from decode_lab import TransformerLM, adjust
from runner_lab import CPU_COST
from transformer_lab import LMConfig, analytic_ops, init_params

S = "lecture06/11_spec_decode_in_engine.py"


@pytest.fixture(scope="module")
def mod():
    return load_script(S)


def test_demo1_every_request_is_exact_and_the_counts_fit_the_exact_joint(mod):
    """脚本那次运行的演示 1 返回的数（它打印的就是这些）；联合分布和 χ² 用测试自己的式子重算。"""
    out = script_results(S)["d1"]
    assert out["greedy"] == out["same0"] == out["same1"] == out["n"] == mod.N_REQ1
    assert out["together"] >= 2
    target = TransformerLM(init_params(mod.SMALL, 5), mod.SMALL)
    V, pr = mod.SMALL.vocab, mod.PROMPT_CHI
    joint = np.array([[adjust(target.full_logits([pr])[0, -1], 1.0)[a]
                       * adjust(target.full_logits([pr + [a]])[0, -1], 1.0)[b] for b in range(V)] for a in range(V)])
    assert np.allclose(joint, out["chi"]["joint"], rtol=1e-12, atol=0)
    c = out["chi"]["counts"]
    assert c.sum() == mod.N_CHI
    exp = joint.ravel() * mod.N_CHI
    big = exp >= 5
    stat = np.sum((c[big] - exp[big]) ** 2 / exp[big]) + (c[~big].sum() - exp[~big].sum()) ** 2 / exp[~big].sum()
    assert abs(stat - out["chi"]["tests"][1][2]) < 1e-9
    assert min(t[4] for t in out["chi"]["tests"][:1]) > 1e-3


def test_time_path_runs_on_the_real_model(mod, capsys, monkeypatch):
    """
    --time 的路径（小到 1 个请求、4 个 token）：真的投机引擎在 SmolLM2 上跑得通，打印墙上时间的表。
    模型用会话里共用的 float64 那一份的前 2 层（脚本自己用 float32 的 30 层，路径一样）：跑得通不看层数（每一层走的是
    同一段代码），词表、分词器和对话模板是真的；一步的时间大半是 lm_head（49152 行），2 层比 6 层约省一半。
    """
    from drafts_lab import layer_subset
    from smollm2_models import smollm2_lm
    full, _, tok = smollm2_lm("float64")
    model = layer_subset(full, range(2), name="SmolLM2 的前 2 层")
    monkeypatch.setitem(mod._CTX, "m", (model, model.cfg, tok))
    monkeypatch.setattr(mod, "TIME_RATES", (1.0,))
    monkeypatch.setattr(mod, "TIME_N", 1)
    monkeypatch.setattr(mod, "N_OUT", 4)
    rows = mod.demo4_timing()
    text = capsys.readouterr().out
    assert len(rows) == 2 and "--time" in text and "TPOT p50 ms" in text


def test_analytic_break_even_uses_the_ledger_with_every_verified_row(mod):
    cfg = LMConfig(name="smol", vocab=49152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64, d_ff=1536,
                   max_seq=8192, tied=True, dtype="float32")
    c = CPU_COST

    def t(B, n, ctx):                                  # 一步：B 个序列各 n 个新位置（每个位置都算 lm_head）
        rows = analytic_ops(cfg, 1, n, ctx, last_only=False)
        flops = B * sum(r["flops"] for r in rows)
        w = sum(r["w"] for r in rows if r["op"] != "embed") * 2          # float32：BF16 账的 2 倍
        kv = B * sum(r["kv"] for r in rows) * 2
        emb = B * sum(r["w"] for r in rows if r["op"] == "embed") * 2
        tf, tw = flops / c["flops_per_s"], (w + emb) / c["bytes_per_s"]      # 标定的时钟：KV 单算一项
        core = max(tf, tw) + (1 - c["overlap"]) * min(tf, tw)
        if B * n <= c["rowwise_rows"]:                 # 行数 ≤ 3：一行一次的 GEMV 路
            core = (w + emb) / c["gemv_bytes_per_s"] * (1 + (B * n - 1) * c["reread"])
        return core + kv / c["kv_bytes_per_s"] + c["step_s"] + B * c["seq_s"]

    b_star, sp = mod.analytic_break_even(cfg, 2.5, 3.0, 50)
    for B in (1, 4, b_star):
        assert sp[B] == pytest.approx(2.5 * t(B, 1, 50) / t(B, 4, 50), rel=1e-12)
    assert sp[b_star] < 1.0 <= sp[b_star - 1]


def _table_rows(text, first_header):
    lines = text.splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith(first_header) and "吞吐" in l)
    rows = []
    for line in lines[i + 2:]:
        if not line.strip() or not line.strip()[0].isdigit():
            break
        rows.append(line.split())
    return rows


def test_demo2_break_even_rate_and_goodput_are_the_tables(mod):
    text = script_stdout(S)
    rows = _table_rows(text, "到达率/s")
    rates = [float(r[0]) for r in rows]
    assert rates == list(mod.RATES)
    tput = {float(r[0]): (float(r[1]), float(r[4]), float(r[7])) for r in rows}
    att = {float(r[0]): (int(r[2][:-1]), int(r[5][:-1]), int(r[8][:-1])) for r in rows}
    worse = [r for r in rates if tput[r][1] < tput[r][0]]
    m = re.search(r"到达率 ([\d.]+)/s 起投机的吞吐比普通的低", text)
    assert m and worse and float(m.group(1)) == worse[0]
    m = re.search(r"普通 ([\d.]+)/s、投机 ([\d.]+)/s、加开关 ([\d.]+)/s", text)
    want = [max([r for r in rates if att[r][j] >= 90], default=0.0) for j in range(3)]
    assert [float(x) for x in m.groups()] == want
    top = rates[-1]
    if "开关一次也没关掉投机" in text:                # 标定的时钟下不划算的批（b*）比排出来的批大：开关不动手
        assert all(tput[r][2] == tput[r][1] for r in rates)
    else:
        assert tput[top][2] > tput[top][1], "开关在最高的到达率下找回吞吐"


def test_demo3_blocks_given_back_are_at_most_the_wasted_positions():
    text = script_stdout(S)
    line = next(l for l in text.splitlines() if l.startswith("投机 ") and len(l.split()) == 7)
    steps, peak, mean, verified, wasted, freed = line.split()[1:]
    assert 0 <= int(freed) <= int(wasted) <= int(verified)
    assert int(freed) > 0
