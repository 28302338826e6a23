"""
种错时整个测试套件都没发现的两处（玩具模型，离线、快，不起 SmolLM2）：

- test_lazy_q_residual_uses_the_targets_float64_p_bit_for_bit：split_worker_lab 的 lazy_q 协议在第一个拒绝的位置
  把 p_n 送回草稿那边，草稿从 norm(max(0, p_n − q_n)) 抽修正 token。p_n 必须是目标验证时用的那一行 float64，
  逐位相同。抓的错：p_n 在回答里（或草稿收到后）被舍入成 float32（哪怕再转回 float64）——舍入只动最后几位，
  抽出的 token 几乎总是不变，有效载荷的测试也看不出"转成 float32 又转回来"。两个 worker 的身体在本进程里跑
  （目标在一个线程里，中间是真的 link_lab.Link），所以能在两边各放一个探针。
- test_prompt_lookup_rejections_keep_the_targets_correction_token：lookup_lab.speculative_generate_adaptive 用
  prompt lookup、T = 0 时输出 == 目标的贪心（手算：二元语法表每行的 argmax），而且提示里重复的二元组后面跟着的
  token 不是目标会接的，所以一定有被拒绝的轮。抓的错：拒绝时留下被拒绝的草稿 token，不用目标的修正 token
  （只有照抄的提示时每一轮要么全部接受、要么提议不出东西，看不出来）。

挤出时把草稿 KV 的位置归零（scheduler_lab.Scheduler._preempt 里的 req.d_computed = 0）没有测试：被挤出的请求只能
从等待队列回来，回来的那一刻 Scheduler.schedule 把 d_computed 重新设成 start（前缀缓存命中的长度），
在那之前它不在任何一步的段里，没有代码读它——那一行删掉什么都不变。
"""
import multiprocessing as mp
import threading

import numpy as np

import split_worker_lab as sw
from decode_lab import NGramLM
from link_lab import Link
from lookup_lab import PromptLookup, speculative_generate_adaptive
from split_models_lab import build_split_model

TARGET, DRAFT = "qcfg:0", "qcfg-layers:2:0"        # 同 test_split_workers：T = 1 时既有全部接受也有拒绝的轮
PROMPT = [5, 17, 101, 3, 44, 9]


class _Ctrl:
    """草稿 worker 的控制管道的替身：请求进行中父进程不发消息。"""

    def poll(self):
        return False


def _split_in_process(monkeypatch, gamma, T, seed, n_new=14):
    """
    草稿那边的 _draft_request 在本线程、目标那边的 _TargetState.verify 在另一个线程，中间是一对 Link（管道）。
    -> (目标验证时拒绝位置上的 p 的 list, 草稿抽修正 token 时用的 p 的 list, 草稿那边的 token)。
    """
    target, draft = build_split_model(TARGET), build_split_model(DRAFT)
    at_target, at_draft = [], []
    real_verify, real_residual = sw.verify_chain, sw.residual_distribution

    def spy_verify(ps, qs, drafts, rng):            # 目标那边（lazy_q 里只有它调 verify_chain）
        n, tok = real_verify(ps, qs, drafts, rng)
        if n < len(drafts):
            at_target.append(np.array(ps[n], copy=True))
        return n, tok

    def spy_residual(p, q):                         # 草稿那边（拒绝时从残差抽修正 token）
        at_draft.append(np.array(p, copy=True))
        return real_residual(p, q)

    monkeypatch.setattr(sw, "verify_chain", spy_verify)
    monkeypatch.setattr(sw, "residual_distribution", spy_residual)
    args = {"prompt": list(PROMPT), "n_new": n_new, "gamma": gamma, "T": T, "seed": seed, "protocol": "lazy_q",
            "overlap": False, "link_delay_s": 0.0, "link_bytes_per_s": None, "stop": None, "timed": False}
    a, b = mp.Pipe()
    st, t_link = sw._TargetState(target, args), Link(b)

    def serve():
        try:
            while True:
                t_link.send(st.verify(t_link.recv()))
        except (EOFError, OSError):
            return

    th = threading.Thread(target=serve, daemon=True)
    th.start()
    try:
        toks, _ = sw._draft_request(draft, Link(a), _Ctrl(), args)
    finally:
        a.close()
        th.join(5)
        b.close()
    assert not th.is_alive()
    return at_target, at_draft, toks


def test_lazy_q_residual_uses_the_targets_float64_p_bit_for_bit(monkeypatch):
    """
    草稿抽修正 token 用的 p_n 必须逐位等于目标验证时的那一行（float64）：舍入成 float32 的 softmax 行和原来的
    float64 行逐位相同的可能只有每个数都能被 float32 精确表示时（T = 1 的 softmax 不会），所以这里不用容差。
    """
    rejections = 0
    for seed in range(3):
        at_target, at_draft, _ = _split_in_process(monkeypatch, gamma=3, T=1.0, seed=seed)
        assert len(at_target) == len(at_draft), "每个拒绝的位置草稿那边都抽一次修正 token"
        for p_t, p_d in zip(at_target, at_draft):
            assert p_t.dtype == np.float64
            assert p_d.dtype == np.float64, f"p_n 过来成了 {p_d.dtype}（应当是 float64）"
            assert np.array_equal(p_d, p_t), "p_n 在路上被改了（舍入？）：草稿的残差要用目标验证时的那个 p"
        rejections += len(at_target)
    assert rejections >= 3, "要走到拒绝的轮（p_n 才会回到草稿那边）"


# ---------------------------------------------------------------------------
# prompt lookup 的拒绝
# ---------------------------------------------------------------------------
V = 8


def _shift_table():
    """二元语法表：上一个 token a 之后最可能的是 (a + 1) mod V（logits 3 对 0：argmax 唯一）。"""
    t = np.zeros((V, V))
    t[np.arange(V), (np.arange(V) + 1) % V] = 3.0
    return t


def test_prompt_lookup_rejections_keep_the_targets_correction_token():
    """
    提示里二元组 (0, 1) 后面跟过 5 和 6，目标（a 之后接 a + 1）在 1 之后要的是 2：最后一个二元组 (0, 1) 抄来的
    草稿 6 一定被拒绝，修正 token 是 2；之后生成的 ... 0 1 2 ... 又让抄来的草稿全部接受。T = 0 时输出 == 贪心，
    贪心手算：从最后一个 token 1 起每步 + 1 (mod V)。
    """
    prompt = [0, 1, 5, 0, 1, 6, 0, 1]
    n_new = 20
    greedy = [(1 + i) % V for i in range(1, n_new + 1)]
    target = NGramLM(_shift_table())
    for gamma, gmax in ((3, None), (2, 5)):
        out, st = speculative_generate_adaptive(target, PromptLookup(2), prompt, n_new, gamma, 0.0,
                                                np.random.default_rng(0), gamma_max=gmax)
        assert [int(t) for t in out] == greedy, (gamma, gmax)
        rounds = list(zip(st["accepted"], st["drafted"]))
        assert any(n < k for n, k in rounds), f"要有被拒绝的轮：{rounds}"
        assert any(n == k > 0 for n, k in rounds), f"也要有全部接受的轮：{rounds}"
