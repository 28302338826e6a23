"""
lecture05/cpu_calibration.json 和读它的模型时钟（runner_lab.CPU_COST、modelled_step_time），tests/bench_engine.py 的拟合。
"""
import json

import numpy as np
import pytest

import bench_engine as be
import runner_lab
from llm_math import SMOLLM2_135M as S
from runner_lab import CALIBRATION_PATH, COST_KEYS, load_calibration, modelled_step_time, step_counts
from transformer_lab import LMConfig

CFG = LMConfig(name=S.name, vocab=S.vocab, d_model=S.d_model, n_layers=S.n_layers, n_heads=S.n_heads,
               n_kv_heads=S.n_kv_heads, head_dim=S.head_dim, d_ff=S.d_ff, max_seq=2048, tied=True, dtype="float32")
OLD = {"flops_per_s": 53e9, "bytes_per_s": 10.4e9, "step_s": 2.0e-3, "seq_s": 0.5e-3}   # 标定以前猜的常数


def _doc():
    with open(CALIBRATION_PATH, encoding="utf-8") as f:
        return json.load(f)


def test_shipped_file_is_the_clock_and_records_how_it_was_made():
    """CPU_COST 就是文件里 engine_step 一节的常数；这一节记着命令、机器（CPU、numpy、BLAS、线程）、日期和残差。"""
    sec = _doc()["sections"]["engine_step"]
    assert runner_lab.CPU_COST == sec["constants"]
    assert set(sec["constants"]) == set(COST_KEYS)
    assert sec["command"] in ("python3 tests/bench_engine.py --calibrate --write",           # 三节一起量
                              "python3 tests/bench_engine.py --calibrate engine_step --write")  # 只量这一节
    for key in ("cpu", "numpy", "blas", "blas_threads", "load_avg_1min_at_start", "loaded"):
        assert key in sec["machine"]
    assert sec["date"][:2] == "20"
    pts = sec["fit"]["points"]
    assert len(pts) == 2 * len(be.DECODE_BATCHES) + len(be.PREFILL_CHUNKS) + len(be.MIXED)
    for p in pts:                                           # 残差就是 模型 / 实测 − 1（四舍五入到 4 位）
        assert p["residual"] == pytest.approx(p["modelled_ms"] / p["measured_ms"] - 1, abs=2e-4)
    assert sec["fit"]["max_abs_residual"] == pytest.approx(max(abs(p["residual"]) for p in pts), abs=1e-4)


def test_calibrated_constants_are_not_the_old_guesses():
    """回归：页面曾经用猜的常数（53 GFLOP/s、10.4 GB/s、每步 2 ms、每序列 0.5 ms），和实测差两倍多。"""
    c = runner_lab.CPU_COST
    assert any(abs(c[k] / OLD[k] - 1) > 0.05 for k in OLD)
    assert "kv_bytes_per_s" in c and 0.0 <= c["overlap"] <= 1.0


def test_modelled_step_time_closed_form():
    """模型时间的式子，手算：max + (1 − ω)·min + KV / 速率 + a + b·序列数；没有 overlap、KV 速率的 dict 是旧的 roofline。"""
    c = {"flops_per_s": 10.0, "bytes_per_s": 2.0, "overlap": 0.25, "kv_bytes_per_s": 4.0, "step_s": 1.0, "seq_s": 0.5}
    k = {"flops": 30.0, "bytes": 10.0, "kv_bytes": 2.0, "seqs": 2}
    # t_f = 3，t_w = (10 − 2) / 2 = 4，t_kv = 0.5：4 + 0.75·3 + 0.5 + 1 + 1
    assert modelled_step_time(k, c) == pytest.approx(8.75)
    assert modelled_step_time(k, OLD) == pytest.approx(max(30 / 53e9, 10 / 10.4e9) + 2e-3 + 1e-3)
    # 行数 ≤ rowwise_rows：GEMV 那条路 (10 − 2) / 4 × (1 + (3 − 1)·0.5) = 4，FLOPs 不计
    g = dict(c, gemv_bytes_per_s=4.0, reread=0.5, rowwise_rows=3)
    assert modelled_step_time(dict(k, tokens=3), g) == pytest.approx(4 + 0.5 + 1 + 1)
    assert modelled_step_time(dict(k, tokens=4), g) == pytest.approx(8.75)          # 4 行：一次 GEMM
    assert modelled_step_time(k, g) == pytest.approx(8.75)                           # 没有 tokens：GEMM


def test_step_counts_split_out_the_kv_bytes():
    """kv_bytes = 每段的 KV 字节之和（chunk_counts 的第 3 项），bytes 里包含它。"""
    ch = [(1, 100, True), (1, 30, True), (16, 0, False)]
    k = step_counts(CFG, ch)
    kv = sum(runner_lab.chunk_counts(CFG, n, s, smp)[2] for n, s, smp in ch)
    assert k["kv_bytes"] == pytest.approx(kv) and k["bytes"] > k["kv_bytes"] > 0


def test_fit_recovers_the_times_of_known_constants():
    """拟合：用已知常数算出一串步的时间，拟合回来的常数给的时间和它们差 < 3%（网格只搜到几个百分点）。"""
    true = {"flops_per_s": 60e9, "bytes_per_s": 12e9, "overlap": 0.4, "kv_bytes_per_s": 3e9, "step_s": 3e-3,
            "seq_s": 0.3e-3, "gemv_bytes_per_s": 25e9, "reread": 0.6, "rowwise_rows": runner_lab.ROWWISE_MAX_ROWS}
    steps = ([[(1, c + 1, True)] * B for c in (64, 256) for B in (1, 2, 3, 4, 8, 64)] + [[(64, 0, True)], [(256, 0, True)]]
             + [[(1, 65, True)] * 8 + [(128, 0, True)]])
    pts = [(step_counts(CFG, ch), modelled_step_time(step_counts(CFG, ch), true)) for ch in steps]
    fit = be.fit_cost(pts, n_grid=13, rounds=4)
    worst = max(abs(modelled_step_time(k, fit) / t - 1) for k, t in pts)
    assert worst < 0.03
    assert abs(fit["overlap"] - true["overlap"]) <= 0.2


def test_missing_section_says_which_command_to_run(tmp_path):
    p = tmp_path / "c.json"
    p.write_text(json.dumps({"schema": 1, "sections": {}}))
    with pytest.raises(ValueError, match="--calibrate --write"):
        load_calibration("engine_step", str(p))
    with pytest.raises(ValueError, match="--calibrate --write"):
        load_calibration("engine_step", str(tmp_path / "missing.json"))


def test_machine_info_names_cpu_numpy_and_blas():
    info = be.machine_info()
    assert info["numpy"] == np.__version__ and info["cpu"] and info["blas"]


def test_decode_op_ledger_equals_the_analytic_ledger():
    """--profile 的账 == ledger_lab.analytic_ops（融合的 qkv = q + k + v、gate_up = gate + up；字节 BF16 × 2 = float32）。"""
    from transformer_lab import analytic_ops
    B, ctx = 4, 64
    rows = {r["op"]: r for r in analytic_ops(CFG, B, 1, ctx, last_only=True)}
    led = runner_lab.decode_op_ledger(CFG, B, ctx)
    groups = {"qkv": ("q_proj", "k_proj", "v_proj"), "o_proj": ("o_proj",), "gate_up": ("mlp_gate", "mlp_up"),
              "down": ("mlp_down",), "lm_head": ("lm_head",)}
    for op, names in groups.items():
        assert led[op] == (sum(rows[n]["flops"] for n in names), 2 * sum(rows[n]["w"] for n in names))
    assert led["attention"] == (rows["attn_scores"]["flops"] + rows["attn_av"]["flops"],
                                2 * (rows["attn_scores"]["kv"] + rows["attn_av"]["kv"]))
    assert led["gather"] == (0, 2 * led["attention"][1])


def test_08_time_ledger_prints_every_op_with_its_ledger(capsys, monkeypatch):
    """05/08 --time 的按算子的账：一个小模型代替 SmolLM2，每个权重算子都量到了时间，FLOPs 列 = decode_op_ledger 的。"""
    from conftest import load_script
    from decode_lab import TransformerLM
    from transformer_lab import init_params
    mod = load_script("lecture05/08_numpy_engine.py")
    cfg = LMConfig(vocab=1100, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, d_ff=64, max_seq=64,
                   dtype="float32")
    monkeypatch.setitem(mod._LOADED, "m", (TransformerLM(init_params(cfg, 0), cfg), cfg, None))
    monkeypatch.setattr(mod, "CTX_DECODE", 8)
    mod.print_step_ledger(cfg, 2)
    out = capsys.readouterr().out
    led = runner_lab.decode_op_ledger(cfg, 2, 8)
    for op in ("qkv", "o_proj", "gate_up", "down", "lm_head", "attention"):
        line = next(l for l in out.splitlines() if l.split() and l.split()[0] == op)
        assert float(line.split()[1]) >= 0 and f"{led[op][0] / 1e9:.3f}" in line


def test_calibrate_engine_step_measures_only_that_section(monkeypatch):
    """--calibrate engine_step：只调 calibrate（记下的命令是这一条），异构和解耦两节不量；不带它时三节都量。
    （量的函数和模型都换成假的：只看 main 的分派。）"""
    calls = []
    monkeypatch.setattr(be, "calibrate", lambda model, cfg, write, command=be.COMMAND: calls.append(("engine", write, command)))
    monkeypatch.setattr(be, "calibrate_heterogeneous", lambda write, note="": calls.append(("hetero", write)))
    monkeypatch.setattr(be, "calibrate_disaggregation", lambda write: calls.append(("disagg", write)))
    import real_model_lab
    import transformer_lab
    monkeypatch.setattr(real_model_lab, "load_gguf", lambda dtype=None: (None, None, None))
    monkeypatch.setattr(transformer_lab, "NumpyTransformer", lambda P, cfg: None)
    be.main(["--calibrate", "engine_step", "--write"])
    assert calls == [("engine", True, "python3 tests/bench_engine.py --calibrate engine_step --write")]
    calls.clear()
    be.main(["--calibrate"])
    assert calls == [("hetero", False), ("engine", False, be.COMMAND), ("disagg", False)]
