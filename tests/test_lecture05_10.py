"""lecture05/10_disaggregation_measured.py：演示返回的数字（真的 worker 进程，玩具模型）。"""
from conftest import load_script

S = load_script("lecture05/10_disaggregation_measured.py")


def test_demo1_nbytes_equals_the_formula_and_shm_sends_only_the_header(capsys):
    r = S.demo1_handoff_bytes()
    assert r["per_tok"] == 2 * 2 * 2 * 8 * 8
    pipe = {n: (nb, w) for v, n, nb, w in r["rows"] if v == "pipe"}
    shm = {n: (nb, w) for v, n, nb, w in r["rows"] if v == "shm"}
    for n, (nb, w) in pipe.items():
        assert nb == 512 * n and w > nb                       # 管道：头 + K、V
        assert shm[n][0] == 512 * n and 0 < shm[n][1] < 1024   # 共享内存：只有头（几百字节）
    assert r["smol_per_tok"] == 2 * 30 * 3 * 64 * 4 and r["smol_total"] == r["smol_per_tok"] * 1024
    assert r["times"]["NVLink 4"] == r["smol_total"] / 450e9


def test_demo2_hits_plus_prefill_is_the_prompt_and_prefix_beats_round_robin(capsys):
    r = S.demo2_routing()
    for v in r.values():
        assert v["hit"] + v["prefill"] == v["total"] and v["total"] == 420
    assert r["prefix"]["hit"] > r["round_robin"]["hit"]
    assert r["prefix"]["hit"] >= r["least_loaded"]["hit"]
