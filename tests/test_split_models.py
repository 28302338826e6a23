"""
split_models_lab：配方字符串 -> 模型。QCFG 的四种和第 6 讲 03 / 种子 04 造的逐个参数相同；"…-layers:K" 和
"前 K 层的参数 + n_layers = K 的配置"重新构造的模型逐位相同；import 不读 SmolLM2；认不出的配方说可以用什么。
"""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

import drafts_lab
import quant_lab
import seed04_models
from decode_lab import TransformerLM
from split_models_lab import (SPLIT_CFG, SPLIT_DRAFT_LAYERS, TINY4, build_split_model, measure_pair_costs,
                              recipe_names)
from transformer_lab import config_like, init_params

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _same_params(a, b):
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_params(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same_params(x, y) for x, y in zip(a, b))
    return np.array_equal(a, b)


@functools.lru_cache(maxsize=None)
def _init_params(cfg, seed):
    """参照的参数（测试自己 init_params）：几个测试要同一份（SPLIT_CFG 种子 0 的三次），只造一次。"""
    return init_params(cfg, seed)


def test_qcfg_recipes_are_seed04s_target_and_drafts(monkeypatch):
    """二元语法表两边都是在目标采样的 token 上拟合的（quant_lab.sample_tokens，64 × 128 个，这个文件里最贵的一步）：
    种子 04 的模型整个会话只建一次（tests/seed04_models.py），配方这边的 sample_tokens 也经过它按参数记住结果的包装——
    参数（参数数组的内容、配置、个数、长度、种子）完全一样才拿记住的 token；配方传的参数不一样（别的种子、别的模型），
    就是一次新的采样，表也就不一样。"""
    remembering = seed04_models._remembering(quant_lab.sample_tokens)
    monkeypatch.setattr(quant_lab, "sample_tokens", remembering)
    monkeypatch.setattr(drafts_lab, "sample_tokens", remembering)
    target, drafts = seed04_models.seed04_models()
    assert _same_params(build_split_model("qcfg:0").params, target.params)
    assert _same_params(build_split_model("qcfg-int4:0").params, drafts["INT4 量化的自己"].params)
    assert np.array_equal(build_split_model("qcfg-bigram:0").table, drafts["二元语法表"].table)
    toks = np.arange(12)[None, :] % 192
    for k in (3, 1):
        assert np.array_equal(build_split_model(f"qcfg-layers:{k}:0").full_logits(toks),
                              drafts[f"只用前 {k} 层"].full_logits(toks))


@pytest.mark.parametrize("recipe,cfg,k", [("tiny4-layers:1:3", TINY4, 1), ("split-draft:0", SPLIT_CFG, SPLIT_DRAFT_LAYERS),
                                          ("split-layers:2:0", SPLIT_CFG, 2)])
def test_layers_recipe_equals_a_model_rebuilt_from_the_first_k_layers(recipe, cfg, k):
    seed = int(recipe.rsplit(":", 1)[1])
    P = _init_params(cfg, seed)
    pk = dict(P)
    pk["layers"] = P["layers"][:k]
    ref = TransformerLM(pk, config_like(cfg, n_layers=k))
    toks = (np.arange(9)[None, :] * 5) % cfg.vocab
    m = build_split_model(recipe)
    assert m.cfg.n_layers == k and np.array_equal(m.full_logits(toks), ref.full_logits(toks))


def test_tiny4_has_a_four_token_vocabulary_and_split_is_the_documented_shape():
    assert build_split_model("tiny4:0").cfg.vocab == 4
    s = build_split_model("split:0")
    assert (s.cfg.n_layers, s.cfg.d_model, s.cfg.vocab) == (16, 192, 512)
    assert _same_params(s.params, _init_params(SPLIT_CFG, 0))


@pytest.mark.parametrize("bad", ["foo:0", "qcfg", "qcfg:x", "qcfg-layers:4:0", "qcfg-layers:0:0", "split:-1",
                                 "smollm2:float16", "smollm2-layers", 3, None])
def test_unknown_recipe_raises_valueerror_listing_what_is_allowed(bad):
    with pytest.raises(ValueError) as e:
        build_split_model(bad)
    for form in recipe_names():
        assert form in str(e.value)


def test_import_does_not_load_the_real_model():
    code = ("import sys; sys.path.insert(0, 'lecture05'); import split_models_lab; "
            "print(sorted(m for m in ('real_model_lab', 'hub_lab', 'gguf_lab') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_measure_pair_costs_reports_both_step_times_and_their_ratio():
    r = measure_pair_costs("tiny4:0", "tiny4-layers:1:0", context=4, n_steps=3, repeats=1)
    assert r["target_ms"] > 0 and r["draft_ms"] > 0 and r["c"] == r["draft_ms"] / r["target_ms"]
    with pytest.raises(ValueError):
        measure_pair_costs("tiny4:0", "tiny4-layers:1:0", context=30, n_steps=5)   # 超过 max_seq = 32
    with pytest.raises(ValueError):
        measure_pair_costs("tiny4:0", "tiny4-layers:1:0", n_steps=0)
