"""
real_model_lab 的测试，用一个**合成的** GGUF（测试自己按格式写出来，不需要下载）：一个 init_params 随机出来的小 Llama，
按 llama.cpp 的约定写进文件（矩阵存成 [out, in]、Q/K 的行按 llama.cpp 的 RoPE 重排、词嵌入共享或单独的 output.weight），
load_gguf 读回来以后，和直接用原参数跑的 NumpyTransformer 比 logits。重排写对了、读的时候撤销对了，两者才一样。
真文件上的核对（对 Hugging Face 的参考 logits）在 tests/test_lecture02_06.py。
"""
import numpy as np
import pytest

from bpe_lab import bytes_to_unicode
from decode_lab import TransformerLM, autoregressive_generate, sample_from_prompts, speculative_generate
from gguf_writer import build_gguf
from real_model_lab import as_dtype, gguf_config, load_gguf, permute_rope_rows, unpermute_rope_rows
from transformer_lab import LMConfig, NumpyTransformer, init_params
from gguf_lab import read_gguf

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
B2U = bytes_to_unicode()
TOKENS = SPECIALS + [B2U[b] for b in range(256)]              # 3 个特殊 token + 256 个单字节 token，没有 merge
CFG = LMConfig(name="synthetic", vocab=len(TOKENS), d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
               d_ff=48, max_seq=64, rope_theta=10000.0, norm_eps=1e-5, head_gain=2.0)


def _by_hand_permute(w, heads):
    """llama.cpp 的重排，逐行手写：GGUF 的第 h·hd + 2i + s 行 = HF 的第 h·hd + s·hd/2 + i 行。"""
    rows = w.shape[0]
    hd = rows // heads
    out = np.empty_like(w)
    for h in range(heads):
        for i in range(hd // 2):
            for s in (0, 1):
                out[h * hd + 2 * i + s] = w[h * hd + s * hd // 2 + i]
    return out


def _meta(arch="llama", extra=()):
    md = [("general.architecture", "string", arch), ("general.basename", "string", "synthetic"),
          ("llama.block_count", "uint32", CFG.n_layers), ("llama.context_length", "uint32", CFG.max_seq),
          ("llama.embedding_length", "uint32", CFG.d_model), ("llama.feed_forward_length", "uint32", CFG.d_ff),
          ("llama.attention.head_count", "uint32", CFG.n_heads),
          ("llama.attention.head_count_kv", "uint32", CFG.n_kv_heads),
          ("llama.rope.freq_base", "float32", CFG.rope_theta),
          ("llama.attention.layer_norm_rms_epsilon", "float32", CFG.norm_eps),
          ("tokenizer.ggml.model", "string", "gpt2"), ("tokenizer.ggml.pre", "string", "smollm"),
          ("tokenizer.ggml.tokens", "array", ("string", TOKENS)),
          ("tokenizer.ggml.token_type", "array", ("int32", [3, 3, 3] + [1] * 256)),
          ("tokenizer.ggml.merges", "array", ("string", [])),
          ("tokenizer.ggml.bos_token_id", "uint32", 1), ("tokenizer.ggml.eos_token_id", "uint32", 2)]
    return md + list(extra)


def _f32(name, a):
    a = np.ascontiguousarray(a, dtype="<f4")
    return (name, a.shape, "F32", a.tobytes())


def _write(tmp_path, P, tied=True, meta=None, permute=_by_hand_permute, name="m.gguf"):
    t = [_f32("token_embd.weight", P["embed"])]
    for i, L in enumerate(P["layers"]):
        b = f"blk.{i}."
        t += [_f32(b + "attn_norm.weight", L["attn_norm"]),
              _f32(b + "attn_q.weight", permute(L["wq"].T, CFG.n_heads)),
              _f32(b + "attn_k.weight", permute(L["wk"].T, CFG.n_kv_heads)),
              _f32(b + "attn_v.weight", L["wv"].T), _f32(b + "attn_output.weight", L["wo"].T),
              _f32(b + "ffn_norm.weight", L["mlp_norm"]), _f32(b + "ffn_gate.weight", L["w_gate"].T),
              _f32(b + "ffn_up.weight", L["w_up"].T), _f32(b + "ffn_down.weight", L["w_down"].T)]
    t.append(_f32("output_norm.weight", P["final_norm"]))
    if not tied:
        t.append(_f32("output.weight", P["lm_head"].T))
    path = tmp_path / name
    path.write_bytes(build_gguf(_meta() if meta is None else meta, t))
    return str(path)


def _params(tied):
    """float32 能精确表示的参数（先舍入到 float32），norm 的权重也随机，这样重排和 RMSNorm 都会影响结果。"""
    P = init_params(CFG, seed=3)
    rng = np.random.default_rng(4)
    f32 = lambda a: np.asarray(a, dtype=np.float32).astype(np.float64)  # noqa: E731
    P = {"embed": f32(P["embed"]), "final_norm": f32(1 + 0.3 * rng.standard_normal(CFG.d_model)),
         "layers": [{k: f32(v if "norm" not in k else 1 + 0.3 * rng.standard_normal(CFG.d_model))
                     for k, v in L.items()} for L in P["layers"]],
         "lm_head": f32(P["lm_head"])}
    if tied:
        P["lm_head"] = P["embed"].T
    return P


TOKS = np.array([[1, 70, 71, 72, 2, 5, 200, 9, 33]])


@pytest.mark.parametrize("tied", [True, False])
def test_synthetic_gguf_loads_to_the_same_logits_as_its_parameters(tmp_path, tied):
    P = _params(tied)
    Pl, cfg, tok = load_gguf(_write(tmp_path, P, tied=tied))
    assert cfg.tied is tied and cfg.vocab == len(TOKENS) and cfg.n_layers == 2
    assert cfg.norm_eps == float(np.float32(1e-5))                  # 文件里是 float32：9.99999974738e-06
    ref = NumpyTransformer(P, LMConfig(**{**CFG.__dict__, "tied": tied, "norm_eps": cfg.norm_eps}))
    got = NumpyTransformer(Pl, cfg)
    assert np.abs(got.forward(TOKS) - ref.forward(TOKS)).max() < 1e-12
    for i, L in enumerate(P["layers"]):
        for k in L:
            assert np.array_equal(Pl["layers"][i][k], L[k]), k
    assert tok.encode("abc") == [3 + ord("a"), 3 + ord("b"), 3 + ord("c")] and tok.chat("x")[0] == 1


def test_the_permutation_matters_not_undone_or_undone_twice_is_far_off(tmp_path):
    """llama.cpp 重排过的行不撤销（或者撤销两次）：模型照样跑，logits 却差很远。"""
    P = _params(True)
    ref = NumpyTransformer(*load_gguf(_write(tmp_path, P))[:2]).forward(TOKS)
    never = NumpyTransformer(*load_gguf(_write(tmp_path, P, permute=lambda w, h: w, name="n.gguf"))[:2])
    twice = NumpyTransformer(*load_gguf(_write(tmp_path, P, permute=lambda w, h: _by_hand_permute(
        _by_hand_permute(w, h), h), name="t.gguf"))[:2])
    for wrong in (never, twice):
        assert np.abs(wrong.forward(TOKS) - ref).max() > 0.1


def test_permute_and_unpermute_are_inverse_and_match_the_hand_rule():
    w = np.arange(4 * 8 * 3, dtype=float).reshape(4 * 8, 3)
    assert np.array_equal(permute_rope_rows(w, 4), _by_hand_permute(w, 4))
    assert np.array_equal(unpermute_rope_rows(permute_rope_rows(w, 4), 4), w)
    with pytest.raises(ValueError, match="分不成"):
        unpermute_rope_rows(np.zeros((10, 3)), 4)


def test_float32_load_is_float32_end_to_end(tmp_path):
    """
    容差从 float32 的舍入推出来，不用某台机器量到的数：单位舍入 u = 2⁻²⁴ ≈ 6e-8，舍入误差随机累积时按 √n 长，
    n 取 层数 × 每层 4 次矩阵乘 × 最长的点积 d_ff（2 × 4 × 48 = 384，√n ≈ 20）：logits 的误差约 u·√n·max|z|
    ≈ 1.2e-6·max|z|，断言 1e-5·max|z|（8 倍的余地）。装错 dtype、排错 RoPE 的行，差的是 O(max|z|)。
    """
    P = _params(True)
    Pl, cfg, _ = load_gguf(_write(tmp_path, P), dtype=np.float32)
    assert cfg.dtype == "float32" and Pl["embed"].dtype == np.float32 and Pl["layers"][0]["wq"].dtype == np.float32
    m = NumpyTransformer(Pl, cfg)
    cache = m.new_cache(1)
    out = m.forward(TOKS, cache)
    assert out.dtype == np.float32 and cache.k.dtype == np.float32 and cache.v.dtype == np.float32
    step = m.forward(np.array([[7]]), cache)
    assert step.dtype == np.float32
    ref64 = NumpyTransformer(*load_gguf(_write(tmp_path, P, name="b.gguf"))[:2]).forward(TOKS)
    assert np.abs(out - ref64).max() < 1e-5 * np.abs(ref64).max()


@pytest.mark.parametrize("extra,arch,match", [
    ((), "gpt2", "只支持 general.architecture = 'llama'"),
    ((("llama.rope.scaling.type", "string", "linear"),), "llama", "不支持 RoPE 缩放"),
    ((("llama.rope.dimension_count", "uint32", 4),), "llama", "RoPE 转整个 head_dim"),
])
def test_unsupported_files_say_what_was_found(tmp_path, extra, arch, match):
    path = _write(tmp_path, _params(True), meta=_meta(arch, extra))
    with pytest.raises(ValueError, match=match):
        load_gguf(path)


def test_bad_arguments_and_other_tokenizers(tmp_path):
    path = _write(tmp_path, _params(True))
    with pytest.raises(ValueError, match="max_seq 必须是 1..64"):
        load_gguf(path, max_seq=65)
    with pytest.raises(ValueError, match="dtype 只能是"):
        load_gguf(path, dtype=np.float16)
    md = [m if m[0] != "tokenizer.ggml.pre" else ("tokenizer.ggml.pre", "string", "llama-bpe") for m in _meta()]
    with pytest.raises(ValueError, match="llama-bpe"):
        load_gguf(_write(tmp_path, _params(True), meta=md, name="o.gguf"))
    assert gguf_config(read_gguf(path)).max_seq == 64              # 文件的上下文比 2048 短：取文件的


def test_memory_check_refuses_a_model_that_does_not_fit(tmp_path, monkeypatch):
    import real_model_lab
    monkeypatch.setattr(real_model_lab, "_mem_available", lambda: 1000)
    with pytest.raises(ValueError, match="本机只剩"):
        load_gguf(_write(tmp_path, _params(True)))


# ---------------------------------------------------------------------------
# 停止 token 和从提示成批生成（在玩具上：快）
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy():
    P = _params(True)
    cfg = LMConfig(**{**CFG.__dict__, "tied": True})
    pk = dict(P)
    pk["layers"] = P["layers"][:1]
    return TransformerLM(P, cfg, "t"), TransformerLM(pk, LMConfig(**{**cfg.__dict__, "n_layers": 1}), "d")


def test_stop_token_is_returned_and_ends_generation(toy):
    target, draft = toy
    prompt = [1, 70, 71]
    full = autoregressive_generate(target, prompt, 30, 0, np.random.default_rng(0)).tolist()
    stop = full[5]
    first = full.index(stop)
    got = autoregressive_generate(target, prompt, 30, 0, np.random.default_rng(0), stop=[stop]).tolist()
    assert got == full[:first + 1]
    # 这里停止 token 是修正 / 额外的 token（这个草稿一个都没被接受）；
    # 被接受的草稿里的停止 token 见 tests/test_decode_lab_stop.py（目标自己当草稿）
    for g in (1, 3, 6):
        out, st = speculative_generate(target, draft, prompt, 30, g, 0, np.random.default_rng(1), stop=stop)
        assert out.tolist() == got
        assert sum(a + 1 for a in st["accepted"]) >= len(got) and len(st["accepted"]) == st["target_calls"]
        assert sum(a + 1 for a in st["accepted"][:-1]) < len(got)    # 停下以后没有再开新的一轮


def test_no_stop_by_default_and_bad_stop_ids(toy):
    target, _ = toy
    assert len(autoregressive_generate(target, [1, 2], 12, 1.0, np.random.default_rng(0))) == 12
    with pytest.raises(ValueError, match="停止 token"):
        autoregressive_generate(target, [1, 2], 3, 0, np.random.default_rng(0), stop=[-1])


def test_sample_from_prompts_equals_one_by_one_at_t0_and_cuts_at_stop(toy):
    target, _ = toy
    prompts = [[1, 70, 71], [1, 200]]
    out = sample_from_prompts(target, prompts, 3, 10, 0, np.random.default_rng(0))
    for k, p in enumerate(prompts):
        g = autoregressive_generate(target, p, 10, 0, np.random.default_rng(0)).tolist()
        assert all(o.tolist() == g for o in out[3 * k:3 * k + 3])
    stop = out[0][3]
    cut = sample_from_prompts(target, prompts, 3, 10, 0, np.random.default_rng(0), stop=int(stop))
    assert cut[0].tolist() == out[0].tolist()[:out[0].tolist().index(stop) + 1]


def test_sample_from_prompts_draws_like_the_one_by_one_sampler(toy):
    """T = 1：第 t 步每条序列用一个均匀数。单条序列（n_per_prompt = 1）的抽样和 autoregressive_generate 逐位相同。"""
    target, _ = toy
    a = sample_from_prompts(target, [[1, 70]], 1, 15, 1.0, np.random.default_rng(7))[0]
    b = autoregressive_generate(target, [1, 70], 15, 1.0, np.random.default_rng(7))
    assert np.abs(a - b).max() == 0


@pytest.mark.parametrize("tied", [True, False])
def test_as_dtype_is_the_other_load_bit_for_bit(tmp_path, tied):
    """
    real_model_lab.as_dtype（测试会话用它从一份装好的模型得到另一种 dtype，不再读文件）：和直接按那种 dtype 装的逐位相同，
    两个方向都是；配置只差 dtype；共享的 lm_head 仍是词嵌入的转置视图；分词器是同一个。
    """
    path = _write(tmp_path, _params(tied), tied=tied)
    loads = {dt: load_gguf(path, dtype=np.dtype(dt)) for dt in ("float64", "float32")}
    for src, dst in (("float64", "float32"), ("float32", "float64")):
        P, cfg, tok = as_dtype(loads[src], np.dtype(dst))
        Pw, cfgw, _ = loads[dst]
        assert cfg == cfgw and tok is loads[src][2]
        pairs = [(P["embed"], Pw["embed"]), (P["final_norm"], Pw["final_norm"]), (P["lm_head"], Pw["lm_head"])]
        pairs += [(L[k], Lw[k]) for L, Lw in zip(P["layers"], Pw["layers"]) for k in Lw]
        assert len(P["layers"]) == len(Pw["layers"]) and all(set(L) == set(Lw) for L, Lw in zip(P["layers"], Pw["layers"]))
        for got, want in pairs:
            assert got.dtype == np.dtype(dst) and got.shape == want.shape and np.array_equal(got, want)
        assert np.shares_memory(P["lm_head"], P["embed"]) is tied
    assert as_dtype(loads["float32"], np.float32) is loads["float32"]
    with pytest.raises(ValueError, match="dtype"):
        as_dtype(loads["float32"], np.float16)


@pytest.mark.parametrize("tied", [True, False])
def test_n_layers_loads_the_first_layers_bit_for_bit(tmp_path, tied):
    """load_gguf(n_layers=k)：前 k 层、词嵌入、最后的 RMSNorm 和 lm_head 和全部装出来的逐位相同，cfg.n_layers == k。"""
    path = _write(tmp_path, _params(tied), tied=tied)
    P, cfg, _ = load_gguf(path)
    Pk, cfgk, _ = load_gguf(path, n_layers=1)
    assert cfgk.n_layers == 1 and len(Pk["layers"]) == 1 and cfgk == LMConfig(**{**cfg.__dict__, "n_layers": 1})
    for k in P["layers"][0]:
        assert np.array_equal(Pk["layers"][0][k], P["layers"][0][k]), k
    for k in ("embed", "final_norm", "lm_head"):
        assert np.array_equal(Pk[k], P[k]), k
    for bad in (0, 3, True, 1.5, "1"):
        with pytest.raises(ValueError, match="n_layers"):
            load_gguf(path, n_layers=bad)
