"""
tree_lab.dynamic_tree_generate（EAGLE-2 的动态树）：每次前向的每一行 logits == 把"缓存里它能看到的 token"当普通序列从头喂。

静态树（tree_speculative_generate）的同一条核对在 test_decode_lab_trees.test_every_node_scored_in_generation_equals_a_fresh_
pass_over_its_path；动态树的其它测试只看输出 == 贪心、分布 == 目标：草稿那边节点的位置、遮罩错了，输出照样对（只是接受得少），
那些测试看不出来。这里逐行核对两个模型（目标的整棵树、草稿长树的每一步）。
"""
import numpy as np

from test_decode_lab_trees import WIDE, _models, _Recording
from tree_lab import dynamic_tree_generate


def test_every_node_the_dynamic_tree_scores_equals_a_fresh_pass_over_its_path():
    """T = 1（节点的位置和遮罩与温度无关：T = 0 走同样的长树、同样的目标前向）。"""
    base, drafts = _models(WIDE)
    target, draft = _Recording(base), _Recording(drafts["另一个模型"])
    prompt = [3, 17, 5, 29]
    out, st = dynamic_tree_generate(target, draft, prompt, 8, 8, 1.0, np.random.default_rng(2), top_k=3, depth=3)
    assert len(out) == 8 and len(target.calls) == st["target_calls"]
    assert any(mask is not None for _, _, mask, _ in draft.calls)          # 草稿真的按树形遮罩喂过
    for model in (target, draft):
        for before, new, mask, logits in model.calls:
            ctx_all = before + new
            for i in range(len(new)):
                vis = mask[i] if mask is not None else np.arange(len(ctx_all)) <= len(before) + i
                ctx = [t for t, v in zip(ctx_all, vis) if v]
                assert np.abs(logits[i] - model.full_logits([ctx])[0, -1]).max() < 1e-12
