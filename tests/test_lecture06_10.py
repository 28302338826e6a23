"""
第 6 讲 10_real_model_spec_decode.py（真实模型上的投机解码）。

- float64 的真实循环：T = 0 的投机解码（跳层草稿：真实权重的前 6 层当目标；prompt lookup：整个目标）输出 == 贪心（整段一次前向
  逐位 argmax 核对），精确的轮次（greedy_lab）== 循环的每一轮。
- 脚本的数（脚本自己那次运行存下的：演示返回的数和 ctx 里模型以外的部分，console.save_results）用另一条路径重算：层草稿按测试自己的
  层号取层（不用 layer_subset）用 float64 重算，排名用 argsort，轮次、打乱、相关、式 (1)、定理 3.8、每 token 的字节数都用测试自己写的式子。
- --time 的路径能跑（n = 2，计时的模型是真实权重的 4 层）；打印的观察引用的就是返回的数。
"""
import contextlib
import copy
import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import (compute_early, early_result, load_script, real_model, script_results, script_stdout,
                      smollm2_path)

from decode_lab import TransformerLM, speculative_generate  # noqa: E402
from drafts_lab import layer_skip_draft, layer_subset  # noqa: E402
from greedy_lab import greedy_rounds, lookup_rounds  # noqa: E402
from lookup_lab import PromptLookup, speculative_generate_adaptive  # noqa: E402
from transformer_lab import config_like  # noqa: E402
import spec_math_lab  # noqa: E402
from smollm2_models import fused_layer, new_token_logits, packed, smollm2_lm  # noqa: E402
from quant_lab import LAYER_MATRICES, quantize_matrix  # noqa: E402

S = "lecture06/10_real_model_spec_decode.py"


# ---------------------------------------------------------------------------
# Leviathan 表 3（不需要模型）
# ---------------------------------------------------------------------------
def test_leviathan_table3_is_one_table_the_papers():
    """表 3 只存一份（spec_math_lab），06 和 10 用的是它；内容按论文（arXiv 2211.17192）表 3 逐格核对。"""
    s10, s06 = load_script(S), load_script("lecture06/06_papers_vs_formulas.py")
    assert s06.LEVIATHAN_TABLE3 is spec_math_lab.LEVIATHAN_TABLE3
    assert list(s10.LEVIATHAN_T3) == [tuple(r) for r in spec_math_lab.LEVIATHAN_TABLE3]
    paper = {("GPT-like 6M", None): (0.88, 0.89), ("二元语法", "EnDe"): (0.20, 0.19), ("T5-small", "EnDe"): (0.75, 0.62),
             ("T5-base", "EnDe"): (0.80, 0.68), ("T5-large", "EnDe"): (0.82, 0.71),
             ("二元语法", "CNNDM"): (0.23, 0.16), ("T5-small", "CNNDM"): (0.65, 0.53),
             ("T5-base", "CNNDM"): (0.73, 0.55), ("T5-large", "CNNDM"): (0.74, 0.56),
             ("LaMDA 100M", None): (0.61, 0.57), ("LaMDA 2B", None): (0.71, 0.71), ("LaMDA 8B", None): (0.75, 0.74)}
    got = {(d, t.split()[-1] if t.startswith("T5") else None): (a0, a1) for t, d, a0, a1 in spec_math_lab.LEVIATHAN_TABLE3}
    assert got == paper


def test_leviathan_table3_gaps_by_hand():
    """
    观察 1 的句子（回归：旧的句子说"真实模型对也多半只差 0.01（T5-small 差 0.13）"，是错的）：
    6 对 T5 都是 T = 0 高 0.11–0.18，GPT-like 和 LaMDA 的 4 对最多差 0.04；两个二元语法草稿 T = 0 时 0.20、0.23。
    """
    g = load_script(S).leviathan_t3_gaps()
    assert (g["n_neural"], g["n_t5"], g["n_other"]) == (10, 6, 4)
    assert g["t5"] == pytest.approx((0.11, 0.18), abs=1e-12) and g["t5_all_up"]
    assert g["other"] == pytest.approx(0.04, abs=1e-12)
    assert g["bigram0"] == pytest.approx((0.20, 0.23), abs=1e-12)


# ---------------------------------------------------------------------------
# float64 的真实循环
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def f64():
    target, _, tok = smollm2_lm("float64")          # 整个测试会话共用的 float64 模型（tests/smollm2_models.py）
    return target, tok, load_script(S)


def _greedy_by_teacher_forcing(logits, out, n_new, stop):
    """
    out 是不是目标在提示之后的贪心续写 -> bool。logits：目标在"提示 + out（或以 out 开头的一段）"上整段一次前向、预测
    out 各个 token 的那几个位置的 logits（不经过缓存的 decode，也就不用一步一步地 decode 一遍）。每个 token 都是它的
    前缀上目标的 argmax，并且在第一个 stop（含）或第 n_new 个 token 处结束。float64 的两条前向只差 1e-13 量级的舍入，
    离 argmax 的并列远得很（_top_gap 断言）。
    """
    out = [int(x) for x in out]
    top = np.asarray(logits)[:len(out)].argmax(-1)
    first = next((i for i, t in enumerate(out) if t == stop), None)
    return [int(t) for t in top] == out and len(out) == (n_new if first is None else min(first + 1, n_new))


def _top_gap(logits):
    """每个位置最大和第二大的 logit 之差的最小值（float64 的舍入 ~1e-13 动不了 argmax 的前提）。"""
    top2 = np.sort(np.asarray(logits), axis=-1)[..., -2:]
    return float((top2[..., 1] - top2[..., 0]).min())


LOOP_KEEP, LOOP_SKIP = 6, (3, 1)    # 跳层草稿的循环：目标 = 真实模型的前 6 层，草稿跳过其中的第 3 层
LOOP_VOCAB = 8192                   # 它的 lm_head 只留词表的前这么多列
LOOP_NEW, LOOP_GAMMA = 14, 3        # 生成几个新 token、草稿每轮提议几个


def _layer_skip_loop():
    """
    下面的测试要的那次生成 -> (输出的 token, 生成器的统计, 目标和草稿在"提示 + 输出"上一次前向的 logits)。
    后台装模型的子进程提前算（conftest.compute_early：同一份 float64 模型，结果逐位相同）。
    """
    target, _, tok = smollm2_lm("float64")
    s = load_script(S)
    target = layer_subset(target, range(LOOP_KEEP))              # 一份浅拷贝：换它的 _head 不动会话共用的模型
    target._head = np.ascontiguousarray(target._head[:, :LOOP_VOCAB])
    draft = layer_skip_draft(target, *LOOP_SKIP)
    prompt = tok.chat(s.PROMPTS[0][1])
    out, st = speculative_generate(target, draft, prompt, LOOP_NEW, LOOP_GAMMA, 0.0, np.random.default_rng(0),
                                   stop=s.STOP)
    greedy = [int(x) for x in out]
    # 教师强制的两次前向：lm_head 只乘要的那几行
    return greedy, st, new_token_logits(target, prompt, greedy), new_token_logits(draft, prompt, greedy)


compute_early(_layer_skip_loop)


def test_float64_loop_equals_greedy_and_exact_rounds_layer_skip(f64):
    """
    T = 0 的投机解码（跳层草稿）输出 == 贪心、轮次 == greedy_lab.greedy_rounds（草稿在贪心文本上逐位 argmax 是否一致，
    按 γ 截成一轮一轮）。目标取真实模型的前 LOOP_KEEP 层（layer_subset：真实的权重），草稿跳过其中的 LOOP_SKIP 那几层。
    为什么小的模型就够：投机解码的循环（草稿逐个提议、目标一次核对 γ + 1 个、第一个不同处截断、两边的缓存回滚）对任何
    一对模型都是同一段代码，"输出 == 贪心、轮次 == 到第一个不一致为止"和模型有几层无关；要的只是草稿有时对、有时错
    （下面断言 0 < 一致的比例 < 1，接受的个数有 0 也有 γ）和 argmax 离并列远（_top_gap）。30 层的目标配脚本的跳层草稿
    核对的是同一件事，每一步 decode 多读 4 倍的 float64 权重，比前 8 层还多花约 1.5 秒（前 8 层、跳过 2 层也一样，
    比 6 层多花约 80%；更浅的几种（前 5 层、前 4 层）试过：上面的断言有一条不成立，核对不全）。同样的道理，
    lm_head 只留词表的前
    LOOP_VOCAB 列（词嵌入不变，提示照样查得到；两个模型共用这份 lm_head，说出的 token 都 < LOOP_VOCAB）：整个词表的
    lm_head 每一行的乘加比这 6 层加起来还多，这里每次前向的每一行都算它，占了这个测试一小半的时间。
    """
    _, _, s = f64
    assert s.STOP < LOOP_VOCAB
    greedy, st, lt, ld = early_result(_layer_skip_loop)
    n_new, gamma = LOOP_NEW, LOOP_GAMMA
    assert _greedy_by_teacher_forcing(lt, greedy, n_new, s.STOP)
    assert min(_top_gap(lt), _top_gap(ld)) > 1e-6
    agree = ld.argmax(-1) == np.array(greedy)
    assert 0 < agree.mean() < 1
    mine = greedy_rounds(agree, gamma)
    assert mine["calls"] == st["target_calls"]
    np.testing.assert_array_equal(mine["accepted"][:-1], st["accepted"][:-1])
    assert st["accepted"][-1] >= mine["accepted"][-1]
    assert 0 in st["accepted"] and gamma in st["accepted"]


def _prefilled(model, pre):
    """
    model 的浅拷贝，它的 session() 交出一个已经看过 pre 那几个位置的会话（decode_lab 的会话：缓存的前 pre.pos 个位置抄自
    pre，fed = pre.pos）-> 模型。生成器第一次调用会话时只喂提示的最后一个 token（和草稿），之后和新会话一模一样。
    几次生成共用一次 prefill：提示的前缀在 float64 下只前向一遍（prefill 一次喂完和分两段喂，只差 1e-13 量级的舍入，
    离 argmax 的并列远得很：_top_gap）。只交出一次：第二次调用 session() 就报错，不会两次生成共用一个会话。
    会话第一次算出的第一行 logits（提示的最后一个位置：预测第一个新 token）记在 m.first，测试拿它和一次前向的比：
    抄来的缓存错了（位置错一格、抄错了段），它就不一样。
    """
    m, given = copy.copy(model), []
    m.first = []

    def session():
        assert not given, "一个 _prefilled 的模型只交出一个会话"
        sess = model.session()
        n = pre.pos
        sess.cache.k[:, :, :, :n], sess.cache.v[:, :, :, :n] = pre.k[:, :, :, :n], pre.v[:, :, :, :n]
        sess.cache.pos = sess.fed = n
        feed = sess.logits

        def logits(seq, counter=None):
            out = feed(seq, counter)
            if not m.first:
                m.first.append(out[0])
            return out
        sess.logits = logits
        given.append(sess)
        return sess
    m.session = session
    return m


def test_float64_prompt_lookup_on_the_copy_prompt_equals_greedy_and_exact_rounds(f64, run, staged64):
    """
    prompt lookup（草稿免费：从提示里照抄）在照抄一段话的提示上：T = 0 的输出 == 贪心、轮次 == greedy_lab.lookup_rounds，
    固定的 γ = 4 和脚本的自适应 γ 都是。要真实的 30 层目标（浅的模型不照抄，prompt lookup 就几乎提议不出东西）。
    贪心的核对：float64 的目标在脚本的照抄文本上一次前向的 logits（staged64，float32 的判断那个测试也用它），输出必须就是
    这段文本、每个 token 都是 argmax。两次生成都不再自己 prefill 提示：会话的缓存从 staged64 那次前向记下的 KV 抄
    （_prefilled；不再让提示的 42 个位置各过两遍 30 层和 lm_head：这个测试少花约四分之一的时间）。
    """
    target, tok, s = f64
    _, ctx, _ = run
    prompt, text = ctx["texts"][2]
    assert list(prompt) == tok.chat(s.PROMPTS[2][1])
    logits = staged64["目标"][2]
    assert _top_gap(logits) > 1e-6
    n_new = 24
    runs = ((4, None), (s.ADAPT[0], s.ADAPT[1]))

    pre = staged64["提示的缓存"][2]                 # 目标在提示的前 len − 1 个位置上的 KV（staged64 顺手记下的）
    assert pre.pos == len(prompt) - 1

    models = [_prefilled(target, pre) for _ in runs]

    def lookup(m, g, gmax):
        return speculative_generate_adaptive(m, PromptLookup(s.LOOKUP_N), list(prompt), n_new,
                                             g, 0.0, np.random.default_rng(0), gamma_max=gmax, stop=s.STOP)

    with ThreadPoolExecutor(max_workers=2) as ex:   # 两次生成互不相干（各自的会话和缓存），各占一个核
        outs = list(ex.map(lambda mr: lookup(mr[0], *mr[1]), zip(models, runs)))
    # 抄来的缓存就是目标在提示上的 KV：会话算出的第一个新 token 的 logits == 一次前向的（float64 两条路径只差舍入：
    # 单位舍入 1.1e-16 × 点积长度 1536 × 30 层 × |logit| ~30 约 1.5e-10，远小于 1e-8；缓存错一格要差得多）
    for m in models:
        np.testing.assert_allclose(m.first[0], logits[0], rtol=0, atol=1e-8)
    greedy = None                                   # 第一次的输出按定义核对是贪心；第二次必须和它逐个相同
    for (g, gmax), (out, st) in zip(runs, outs):
        if greedy is None:
            greedy = [int(x) for x in out]
            assert greedy == [int(x) for x in text[:len(greedy)]]
            assert _greedy_by_teacher_forcing(logits, greedy, n_new, s.STOP)
        assert [int(x) for x in out] == greedy
        mine = lookup_rounds(list(prompt), greedy, PromptLookup(s.LOOKUP_N), g, gmax)
        assert mine["calls"] == st["target_calls"] < n_new / 2
        np.testing.assert_array_equal(mine["accepted"][:-1], st["accepted"][:-1])


# ---------------------------------------------------------------------------
# 脚本的数
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run():
    """
    演示返回的数和 ctx（文本、各草稿的排名、目标的 logits……）取自脚本自己的运行（test_scripts 跑的那一次），不在进程里
    再跑 context() 和演示；模型（float32 的参数、目标、跳层草稿）用整个会话共用的那一份 float32 参数在进程里建，放回
    脚本的 ctx（main(["--time", …]) 也就不再重建 context）。
    """
    smollm2_path()                     # 拿不到模型时跳过（CS349E_REQUIRE_MODEL=1 时失败）；数字钉在 SmolLM2 上
    s = load_script(S)
    res = script_results(S)
    P, cfg, tok = real_model("float32")
    target = smollm2_lm("float32")[0]   # 会话共用的 float32 目标（tests/smollm2_models.py，就是这份 P 建的 TransformerLM）
    assert target.params is P
    ctx = s._CTX
    ctx.update(res["ctx"], P=P, tok=tok, target=target, skip=layer_skip_draft(target, *s.SKIP))
    return s, ctx, res["out"]


def _rounds(agree, gamma):
    """测试自己的轮次模拟 -> (每轮接受个数, 每轮起点, 每轮是否完整)。"""
    acc, starts, full, t, n = [], [], [], 0, len(agree)
    while t < n:
        r = 0
        while r < gamma and t + r < n and agree[t + r]:
            r += 1
        acc.append(r)
        starts.append(t)
        full.append(t + gamma < n)
        t += r + 1
    return acc, starts, full


def _per_call(agrees, gamma):
    vals = []
    for a in agrees:
        acc, _, full = _rounds(list(a), gamma)
        vals += [x + 1 for x, f in zip(acc, full) if f]
    return float(np.mean(vals))


def _eq1(a, g):
    return sum(a ** i for i in range(g + 1))


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_greedy_texts_and_target_agreement(run):
    s, ctx, _ = run
    assert ctx["target_mismatch"] == 0
    for (prompt, new), lp in zip(ctx["texts"], ctx["target_logits"]):
        np.testing.assert_array_equal(lp.argmax(-1), new)
        assert 1 <= len(new) <= max(s.N_NEW)
    assert ctx["texts"][2][1][-1] == s.STOP               # 照抄的那段说完就停
    assert ctx["tok"].decode(ctx["texts"][2][1][:-1]).strip() == s.PASSAGE   # 模型真的照抄了
    assert [len(new) for _, new in ctx["texts"][:2]] == list(s.N_NEW[:2])


def _packed(texts):
    """
    几段文本（提示 + 新 token）摞成一条序列，一次前向算完（smollm2_models.packed）-> (toks [1, S]、遮罩 [S, S]、
    RoPE 位置 [S]、每段预测新 token 的那几行的行号、每段的起点)。30 层的前向比三段各算一次少花约一成。
    摞错了（遮罩漏看、位置错位），算出的 logits 就是另一个模型的：test_float32_decisions_hold_on_any_blas 的 err < 1e-2
    立刻不成立。
    """
    toks, mask, pos, starts = packed([np.r_[np.asarray(p), np.asarray(n)] for p, n in texts])
    rows = [s0 + len(p) - 1 + np.arange(len(n)) for s0, (p, n) in zip(starts, texts)]
    return toks, mask, pos, rows, starts


def _through(model, layers, x, pack, caches=None):
    """
    残差流 x [1, S, d] 接着过 layers（融合好的层，model._layers 那样；层号由调用者自己取，不经过 drafts_lab.layer_subset）
    -> 过完这几层的残差流。
    做法：model 的浅拷贝只留这几层（融合好的矩阵和 model 共用），词嵌入换成交回 x，按 pack 的遮罩和位置前向一次；
    forward 每层先对残差流调一次 rms_scale、最后再调一次，最后那次的输入就是过完这几层的 x；lm_head 换成不乘（要的几行
    另外乘：_head_rows）。每层的运算和整个模型一次前向里的那一层完全一样，所以 30 层分几段接着算和一次算完逐位相同。
    没融合的层参数不留（前向只在记账时读它们，这里不记账；读到了就报错，不会悄悄用错）。
    caches 不是 None 时，这次前向自己新建的 KV cache（这几层的）记进 caches。
    """
    toks, mask, pos = pack[:3]
    m = copy.copy(model)
    m._layers = list(layers)
    m.params = dict(model.params, layers=[None] * len(m._layers))
    m.cfg = config_like(model.cfg, n_layers=len(m._layers))
    m.embed = lambda t: x
    last = [None, 0]                 # 最近一次 rms_scale 的输入、调用的次数（只留最后一个：不攒下每层的残差流）

    def rms_scale(h):
        last[:] = h, last[1] + 1
        return model.rms_scale(h)
    m.rms_scale = rms_scale
    m.lm_head = lambda h: h[..., :0]
    if caches is not None:
        m.new_cache = lambda batch=1, max_len=None: caches.append(type(m).new_cache(m, batch, max_len)) or caches[-1]
    m.forward(toks, attn_mask=mask, positions=pos)
    assert last[1] == 2 * len(m._layers) + 1
    return last[0]


def _head_rows(model, x, pack):
    """
    过完全部层的残差流 x -> 每段文本预测新 token 的 logits [新 token 数, V] 的 list：lm_head 只乘这几行（同
    tests/smollm2_models.new_token_logits），几段的行一次乘完（V × d 的 lm_head 只读一遍）。
    """
    rows = pack[3]
    h = model.lm_head(model.rms_scale(x[:, np.concatenate(rows)]))[0]
    return np.split(h, np.cumsum([len(r) for r in rows])[:-1])


QBLOCK = 1 << 17    # 量化时每块的元素数：float64 1 MB，量化的几份临时数组都留在核的缓存里


def _quantized_matrix(w, scheme):
    """
    脚本的量化草稿里的一个矩阵的 float64 版 -> [输入维, 输出维]：quant_lab.quantize_matrix（脚本用的就是它）量化、转成
    float32（脚本算的就是这份权重），再原样转成 float64。量化本身逐元素、不经过 BLAS。
    按列分块算：两个方案的 scale 都属于一列（int8 每个输出通道一个；int4-g32 每列里沿输入维每 32 个一组），
    quantize_int 的每一步不是逐元素就是在一列之内沿输入维，所以一块列单独量化和整个矩阵一起量化逐位相同
    （_quantized_layer_f64 在第 0 层上断言）。整个矩阵一起量化，十来趟逐元素运算每趟都过一遍内存；块小到留在缓存里，
    快约 3 倍。
    """
    n_in, n_out = w.shape
    cb = max(1, QBLOCK // n_in)
    out = np.empty(w.shape)
    for j in range(0, n_out, cb):
        out[:, j:j + cb] = quantize_matrix(w[:, j:j + cb], scheme)[0].astype(np.float32)
    return out


def _quantized_layer_f64(target64, P32, scheme, i):
    """
    脚本的量化草稿（drafts_lab.requantized_draft：每层 7 个矩阵 quant_lab.quantize_matrix 就近舍入、转成 float32）
    第 i 层的 float64 版，融合好的（NumpyTransformer 的 _layers 的一项）：矩阵见 _quantized_matrix，RMSNorm 的权重原样转。
    融合（transformer_lab.NumpyTransformer 的【为了快做的等价变换】）逐层独立：tests/smollm2_models.fused_layer
    只融合这一层，和整个模型一起融合逐位相同。
    """
    layer = {k: _quantized_matrix(v, scheme) if k in LAYER_MATRICES else v.astype(np.float64)
             for k, v in P32["layers"][i].items()}
    if i == 0:                  # 分块量化 == 整个矩阵一起量化（逐位；见 _quantized_matrix）
        for k in LAYER_MATRICES:
            whole = quantize_matrix(P32["layers"][0][k], scheme)[0].astype(np.float32).astype(np.float64)
            assert np.array_equal(layer[k], whole), (scheme, k)
    return fused_layer(target64.cfg, layer)


def _quantized_logits(target64, P32, scheme, x0, pack):
    """
    float64 的量化草稿在摞好的文本上的 logits（_head_rows 的 list）：一层一层地量化、融合、接着算（_through），
    每层用完就丢。没量化的词嵌入（x0）、lm_head、最后的 RMSNorm 和目标共用（float32 的文件权重和 float64 的逐位相同，
    staged64 断言）。任何时候只有一层量化的权重在内存里：不再同时放两个 30 层的草稿（约 1.7 GB 新分配的内存，
    这台虚拟机上第一次写新页很慢）。
    """
    x = x0
    for i in range(target64.cfg.n_layers):
        x = _through(target64, [_quantized_layer_f64(target64, P32, scheme, i)], x, pack)
    return _head_rows(target64, x, pack)


SAFETY = 10     # 余量至少是"float32 离 float64 的距离"的 2 × SAFETY 倍（见下面的测试）

QUANT = (("INT8 的自己", "int8"), ("INT4-g32 的自己", "int4-g32"))    # 脚本的两个量化草稿：标签、方案


@pytest.fixture(scope="module")
def staged64(run, f64):
    """
    float64 的模型在脚本的三段文本上预测新 token 的 logits -> {"目标" / "跳层" / "提前退出" / 两个量化草稿的标签:
    每段文本一个 [新 token 数, V]；"提示的缓存": 每段文本，目标在提示的前 len − 1 个位置上的 KV cache}，几个测试共用。
    三段文本摞成一条序列一次算（_packed）。目标、跳层草稿（跳过第 a..a+n−1 层）、前 k 层草稿（a ≤ k）的前 a 层一样、
    目标和前 k 层草稿的前 k 层一样：目标按层分三段接着算（前 a 层、a..k−1、k..L−1，_through），第 k 层之前的残差流
    就是提前退出的输出，跳层草稿从第 a 层之前的残差流接着算第 a+n 层以后的层。层号都由测试自己给（不经过脚本造草稿用的
    drafts_lab.layer_subset：脚本取错了层，它的 float32 logits 就离这里的 float64 很远，test_float32_decisions_hold_on_any_blas
    的 err < 1e-2 不成立，α 也对不上）。三个模型从头各算一遍要 30 + 26 + 26 层，这样只算 30 + 14 层。
    这些活放进同一个两个线程的池子（numpy 算的时候放开 GIL；测试进程的 BLAS 只用一个线程，两核机器上另一个核这时空着），
    结果和一个接一个算逐位相同（每个线程算的是同样的运算）：目标的前 a 层、两个量化草稿（_quantized_logits）、
    目标其余的层、跳层草稿其余的层（后两份等前 a 层算完）。
    """
    s, ctx, _ = run
    target64, texts, P32 = f64[0], ctx["texts"], ctx["P"]
    for k in ("embed", "lm_head", "final_norm"):    # 量化草稿和目标共用这三份（_quantized_logits）
        assert np.array_equal(P32[k], target64.params[k]), k
    L, (a, n), k = target64.cfg.n_layers, s.SKIP, s.EXIT_K
    assert 1 <= a <= k < L
    lay = target64._layers
    pack = _packed(texts)
    x0 = target64.embed(pack[0])
    caches = []
    with ThreadPoolExecutor(max_workers=2) as ex:
        xa = ex.submit(_through, target64, lay[:a], x0, pack, caches)
        quant = {label: ex.submit(_quantized_logits, target64, P32, scheme, x0, pack) for label, scheme in QUANT}

        def target_rest():
            xk = _through(target64, lay[a:k], xa.result(), pack, caches)
            return _head_rows(target64, _through(target64, lay[k:], xk, pack, caches), pack), _head_rows(target64, xk, pack)

        skip = ex.submit(lambda: _head_rows(target64, _through(target64, lay[a + n:], xa.result(), pack), pack))
        target = ex.submit(target_rest)
        out = {"目标": target.result()[0], "跳层": skip.result(), "提前退出": target.result()[1]}
        out.update({label: f.result() for label, f in quant.items()})
    assert [c.k.shape[0] for c in caches] == [a, k - a, L - k]
    out["提示的缓存"] = []
    for s0, (prompt, _) in zip(pack[4], texts):      # 目标（三段的层）在每段提示的前 m 个位置上的 KV
        m = len(prompt) - 1
        pre = target64.new_cache(1, m)
        for kv in ("k", "v"):
            getattr(pre, kv)[:] = np.concatenate([getattr(c, kv)[:, :, :, s0:s0 + m] for c in caches])
        pre.pos = m
        out["提示的缓存"].append(pre)
    return out


def test_float32_decisions_hold_on_any_blas(run, staged64):
    """
    脚本按 float32 算；不同的 CPU / BLAS（核、线程、numpy 版本）求和的顺序不同，float32 的 logits 就差一点。脚本打印的
    精确的数（α T = 0、每轮 token、树）只取决于"文本的 token 在模型的 logits 里排第几"（排名 0..8：树最宽 8），
    α T = 1 打印 3 位小数。这里用 float64 重算同样的模型（目标和层草稿：文件的 float64 权重；量化的草稿：把 float32 的
    量化权重转成 float64——量化本身是逐元素的，不经过 BLAS，见 _quantized_matrix），量出这台机器上 float32 离 float64 的
    最大距离 err。
    【假设】别的机器的 float32 离 float64 也是这个量级（同样的单位舍入、同样长的点积，只是求和顺序不同），
    两个 float32 结果最多差 2·err。要求：排名 ≤ 8 的位置上，别的 token 的 logit 离文本的 token 的 logit 都超过
    2 × SAFETY × err（排名在任何机器上都一样）；α T = 1 在 ± SAFETY × 它的 float32–float64 差以内舍入到同一个 3 位小数。
    """
    s, ctx, out = run
    staged = staged64
    pairs = [("目标", ctx["target_logits"], staged["目标"])]     # 目标的 float32 logits：脚本自己算的（ctx）
    for label, keep in ((ctx["skip_label"], "跳层"), (f"只用前 {s.EXIT_K} 层", "提前退出")):
        pairs.append((label, ctx["layer_logits"][label], staged[keep]))   # 层草稿的 float32 logits：脚本那次运行的
    toks = [np.asarray(new) for _, new in ctx["texts"]]
    checked = []
    # 量化的草稿：float32 的量化权重原样转成 float64（staged64 里算好的）；float32 的 logits 是脚本那次运行的
    pairs += [(label, ctx["quant_logits"][label], staged[label]) for label, _ in QUANT]
    for label, m32, m64 in pairs:
        l32, l64 = [x.astype(np.float64) for x in m32], m64   # float32 的 logits（都是脚本那次运行算的）
        err = max(float(np.abs(x - y).max()) for x, y in zip(l32, l64))
        assert 0 < err < 1e-2
        for x64, t in zip(l64, toks):
            own = x64[np.arange(t.size), t][:, None]
            rank = (x64 > own).sum(1)
            gap = np.abs(x64 - own)
            gap[np.arange(t.size), t] = np.inf
            near = gap.min(1)[rank <= 8]
            assert (near > 2 * SAFETY * err).all(), (label, float(near.min()), err)
        if label == "目标":
            assert all((x.argmax(-1) == t).all() for x, t in zip(l64, toks))     # float64 的贪心文本也是这段
        else:
            ranks32 = ctx["drafts"][label]["ranks"]
            for x64, t, r32 in zip(l64, toks, ranks32):
                r64 = (x64 > x64[np.arange(t.size), t][:, None]).sum(1)
                np.testing.assert_array_equal(np.minimum(r64, 9), np.minimum(r32, 9))
            b64 = np.concatenate([np.minimum(_softmax(lq), p).sum(-1) for lq, p in zip(l64, p64)])
            a1_32, a1_64 = out["d1"]["alphas"][label][1], float(b64.mean())
            d = max(abs(a1_32 - a1_64), 1e-12)
            assert f"{a1_32 - SAFETY * d:.3f}" == f"{a1_32 + SAFETY * d:.3f}" == f"{a1_32:.3f}", (label, a1_32, d)
        if label == "目标":
            p64 = [_softmax(x) for x in l64]          # 目标的概率：四个草稿共用
        checked.append(label)
    assert len(checked) == 5


def test_alphas_of_layer_drafts_recomputed_from_models_built_from_params(run, staged64):
    """
    两个层草稿的 α：T = 0、T = 1 都由脚本那次运行的 float32 logits（ctx["layer_logits"]）按测试自己的式子重算；
    这些 logits 确实是"按层号取的那几层"的：测试自己取层（_through）的 float64 模型（staged64）逐位 argmax 算出的
    α T = 0 和脚本打印的一样（float32 和 float64 的排名处处相同，test_float32_decisions_hold_on_any_blas 核对余量）。
    """
    s, ctx, out = run
    al = out["d1"]["alphas"]
    own = {ctx["skip_label"]: staged64["跳层"], f"只用前 {s.EXIT_K} 层": staged64["提前退出"]}
    assert sorted(ctx["layer_logits"]) == sorted(own)
    pt = [_softmax(lp) for lp in ctx["target_logits"]]          # 目标的概率：两个草稿共用
    for label, rows in ctx["layer_logits"].items():
        a0 = np.mean(np.concatenate([r.argmax(-1) == np.array(new) for r, (_, new) in zip(rows, ctx["texts"])]))
        b1 = np.concatenate([np.minimum(p, _softmax(lq)).sum(-1) for lq, p in zip(rows, pt)])
        a0_64 = np.mean(np.concatenate([r.argmax(-1) == np.array(new) for r, (_, new) in zip(own[label], ctx["texts"])]))
        assert al[label][0] == pytest.approx(a0, abs=1e-12) and al[label][0] == pytest.approx(a0_64, abs=1e-12)
        assert al[label][1] == pytest.approx(float(b1.mean()), abs=1e-9)
    assert al[ctx["skip_label"]][0] > al[f"只用前 {s.EXIT_K} 层"][0]        # 观察 2 的大小关系
    for n, v in al.items():
        if n not in (ctx["ngram_label"], "prompt lookup"):
            assert (n in out["d1"]["up"]) == (v[0] > v[1])
    toy = out["d1"]["toy"]
    drops = [toy[n][0] - toy[n][1] for n in toy if n != "二元语法表"]
    assert out["d1"]["gap_toy"] == max(drops) < 0                      # 玩具：T = 0 的 α 都更低，至少低这么多
    assert -out["d1"]["gap_toy"] > out["d1"]["gap_real"]               # 比真实目标两列的最大差还大


def test_prompt_lookup_alpha_by_hand(run):
    """prompt lookup 的 β：自己找最近的一次匹配；T = 0 是"提议 == 文本"，T = 1 是目标给提议的概率（没有提议 = 0）。"""
    s, ctx, out = run
    per0, all0, all1 = [], [], []
    for (prompt, new), lp in zip(ctx["texts"], ctx["target_logits"]):
        seq = list(prompt) + list(new)
        p1 = _softmax(lp)
        hits = []
        for t in range(len(new)):
            ctx_seq = seq[:len(prompt) + t]
            key = ctx_seq[-s.LOOKUP_N:]
            nxt = None
            for i in range(len(ctx_seq) - s.LOOKUP_N - 1, -1, -1):
                if ctx_seq[i:i + s.LOOKUP_N] == key:
                    nxt = ctx_seq[i + s.LOOKUP_N]
                    break
            hits.append(nxt == new[t])
            all1.append(0.0 if nxt is None else p1[t, nxt])
        per0.append(np.mean(hits))
        all0 += hits
    a0, a1, per = out["d1"]["alphas"]["prompt lookup"]
    np.testing.assert_allclose(per, per0, atol=1e-12)
    assert a0 == pytest.approx(np.mean(all0), abs=1e-12) and a1 == pytest.approx(np.mean(all1), abs=1e-9)


def test_exact_tokens_per_call_and_eq1(run):
    s, ctx, out = run
    for (name, g), (exact, e1, n_full) in out["d2"]["exact"].items():
        agrees = [r == 0 for r in ctx["drafts"][name]["ranks"]]
        a0 = float(np.concatenate(agrees).mean())
        assert exact == pytest.approx(_per_call(agrees, g), abs=1e-12)
        assert e1 == pytest.approx(_eq1(a0, g), abs=1e-12)
    over = [k for k, v in out["d2"]["exact"].items() if v[0] < v[1] - 1e-12]
    assert sorted(over) == sorted(out["d2"]["over"])


def test_t1_cells_standard_errors(run):
    s, ctx, out = run
    for c in out["d2"]["t1"]:
        x = np.asarray(c["accepted"], dtype=float) + 1
        assert c["per_call"] == pytest.approx(x.mean(), abs=1e-12)
        assert c["se"] == pytest.approx(np.sqrt(((x - x.mean()) ** 2).sum() / (x.size - 1) / x.size), abs=1e-12)
        if c["alpha"] is not None:
            assert c["eq1"] == pytest.approx(_eq1(c["alpha"], c["gamma"]), abs=1e-12)
            assert c["inside"] == (abs(c["per_call"] - c["eq1"]) <= 2 * c["se"])
            assert 0 < c["alpha"] < 1


def test_seed04_sentence_figures(run):
    s, ctx, out = run
    g = s.GAMMA_CORR
    for name, v in out["d3"]["per_draft"].items():
        agrees = [np.asarray(r == 0) for r in ctx["drafts"][name]["ranks"]]
        a = np.concatenate([x[:-1] for x in agrees]).astype(float)
        b = np.concatenate([x[1:] for x in agrees]).astype(float)
        if a.std() > 0 and b.std() > 0:
            assert v["lag1"] == pytest.approx(np.corrcoef(a, b)[0, 1], abs=1e-12)
        st = []
        for x in agrees:
            _, starts, full = _rounds(list(x), g)
            st += [x[t] for t, f in zip(starts, full) if f]
        assert v["alpha_start"] == pytest.approx(np.mean(st), abs=1e-12)
        assert v["err"] == pytest.approx(v["exact"] / _eq1(v["alpha"], g) - 1, abs=1e-12)
        rng = np.random.default_rng(s.SHUFFLE_SEED)
        sh = [_per_call([x[np.argsort(rng.random(x.size))] for x in agrees], g) for _ in range(s.N_SHUFFLE)]
        assert v["shuffled"] == pytest.approx(np.mean(sh), abs=1e-12)
    # 04 的玩具的 r₁（观察 1 的括号；旧的句子里是打上去的"|r| < 0.07"）：T = 0 的指示，每条序列里相邻配对
    toy_t, toy_d, toks = ctx["toy_models"]
    top = toy_t.full_logits(toks).argmax(-1)
    for name, r in out["d3"]["toy_r"].items():
        d = toy_d[name]
        lq = d.table[toks] if name == "二元语法表" else d.full_logits(toks)
        x = (lq.argmax(-1) == top).astype(float)
        assert r == pytest.approx(np.corrcoef(x[:, :-1].ravel(), x[:, 1:].ravel())[0, 1], abs=1e-12)
    assert len(out["d3"]["toy_r"]) == 4


def test_prompt_lookup_rounds_by_hand(run):
    s, ctx, out = run
    for (label, _), (prompt, new) in zip(s.PROMPTS, ctx["texts"]):
        seq0 = list(prompt)
        t, calls = 0, 0
        while t < len(new):                     # γ = 8 固定：自己找匹配、自己数接受
            cur = seq0 + list(new[:t])
            key = cur[-s.LOOKUP_N:]
            prop = []
            for i in range(len(cur) - s.LOOKUP_N - 1, -1, -1):
                if cur[i:i + s.LOOKUP_N] == key:
                    prop = cur[i + s.LOOKUP_N:i + s.LOOKUP_N + 8]
                    break
            r = 0
            while r < len(prop) and t + r < len(new) and prop[r] == new[t + r]:
                r += 1
            t += r + 1
            calls += 1
        assert out["d4"]["rounds"][(label, "γ = 8")]["calls"] == calls
    copy, prose = out["d4"]["rounds"][("照抄", "γ = 8")], out["d4"]["rounds"][("散文", "γ = 8")]
    assert copy["per_call"] > 3 * prose["per_call"]


def _top_order(lq, k):
    """
    每行 logits 从大到小的前 k 个 token（并列时 token id 小的在前）-> [行数, k]：就是 np.argsort(-lq, kind="stable") 的
    前 k 列，只是不给整个词表排序：先用 np.partition 找到第 k 大的值，≥ 它的才可能进前 k（并列的全留下），只给这几个
    候选（按 id 从小到大）做稳定的 argsort。
    """
    neg = -np.asarray(lq)
    kth = np.partition(neg, k - 1, axis=1)[:, k - 1]
    rows = []
    for row, t in zip(neg, kth):
        cand = np.flatnonzero(row <= t)
        rows.append(cand[np.argsort(row[cand], kind="stable")][:k])
    return np.array(rows)


def test_top_order_is_the_stable_argsorts_head():
    """_top_order 和整行的稳定 argsort 的前 k 列逐个相同，并列（包括跨过第 k 个的并列）也一样。"""
    rng = np.random.default_rng(0)
    lq = rng.integers(0, 6, size=(40, 50)).astype(np.float32)        # 很多并列
    for k in (1, 3, 8):
        np.testing.assert_array_equal(_top_order(lq, k), np.argsort(-lq, axis=1, kind="stable")[:, :k])


def test_tree_figures_from_argsort_ranks(run):
    s, ctx, out = run
    label = ctx["skip_label"]
    # 每段文本的前几名只排一次（和树的形状无关）；树最宽 8，只要稳定 argsort 的前 8 列（_top_order）
    w_max = max(max(w) for w in s.TREES)
    orders = [_top_order(lq, w_max) for lq in ctx["layer_logits"][label]]
    for widths in s.TREES:
        vals = []
        for order, (_, new) in zip(orders, ctx["texts"]):
            t, d = 0, len(widths)
            while t < len(new):
                r = 0
                while r < d and t + r < len(new) and new[t + r] in order[t + r, :widths[r]]:
                    r += 1
                if t + d < len(new):
                    vals.append(r + 1)
                t += r + 1
        assert out["d5"]["per_call"][(widths, label)] == pytest.approx(np.mean(vals), abs=1e-12)


def test_cost_coefficients_and_theorem_3_8(run):
    s, ctx, out = run
    cfg = ctx["cfg"]
    per_layer = cfg.d_model * (cfg.n_heads + 2 * cfg.n_kv_heads) * cfg.head_dim \
        + cfg.n_heads * cfg.head_dim * cfg.d_model + 3 * cfg.d_model * cfg.d_ff
    head = cfg.d_model * cfg.vocab
    target = (cfg.n_layers * per_layer + head) * 2.0
    assert ctx["costs"]["target_bf16"] == pytest.approx(target, rel=1e-15)
    assert ctx["costs"]["target_file"] == pytest.approx(cfg.n_layers * per_layer * 5 / 8 + head * 8.5 / 8, rel=1e-15)
    kept = cfg.n_layers - s.SKIP[1]
    want = {ctx["skip_label"]: (kept * per_layer + head) * 2.0 / target,
            "INT4-g32 的自己": (cfg.n_layers * per_layer * 4.5 / 8 + head * 2.0) / target}
    for name, c in want.items():
        assert out["d6"][name]["c"] == pytest.approx(c, rel=1e-12)
    for name, v in out["d6"].items():
        a = out["d1"]["alphas"][name][0]
        if v["c"] == 0:
            assert v["speedup"] == pytest.approx(1 / (1 - a), rel=1e-12)
            assert v["gamma_star"] == (0 if a == 0 else None)     # α = 0 的免费草稿：不划算，不是 γ = ∞
            continue
        sp = {g: _eq1(a, g) / (g * v["c"] + 1) for g in range(1, 200)}
        g_best = max(sp, key=sp.get)
        if sp[g_best] <= 1:
            assert v["gamma_star"] == 0
        else:
            assert v["gamma_star"] == g_best and v["speedup"] == pytest.approx(sp[g_best], rel=1e-12)
    # 跳层草稿：α < c，推论 3.9 的条件不成立（观察 3 这样说）
    assert out["d1"]["alphas"][ctx["skip_label"]][0] < out["d6"][ctx["skip_label"]]["c"]


TIME_LAYERS = (0, 1, 29)          # --time 的测试里计时的目标：真实模型的这 3 层（跳层草稿跳过其中的第 1 层）
TIME_VOCAB = 512                  # 计时的模型的 lm_head 只留词表的前这么多列（见 test_time_path_runs）


def test_time_path_runs(run, monkeypatch):
    """
    --time：每种做法重复 k 次；中位数、范围、同一遍里的比值都由返回的时间重算；预测按式子。
    计时只跑一遍，经过 main(["--time", "2"])：演示 1–6 照常（脚本自己的运行已经跑过它们：这里换成记下调用、交回那次运行的数），
    然后命令行的 n 交给演示 7（这里让它重复 3 次，核对中位数和范围），它返回的数就是下面核对的。
    计时的目标换成真实模型的 TIME_LAYERS 那 3 层（layer_subset），lm_head 只留前 TIME_VOCAB 列（词嵌入不变：提示的
    token 照样查得到；模型只会说出 id < TIME_VOCAB 的 token，停止 token 在里面），跳层草稿照样从它跳层：这里核对的是
    计时的算术（中位数、范围、比值、预测）和观察引用的数，和模型有几层、词表多大无关（预测的 ĉ 取自 ctx 的运算量，
    不看计时的模型；观察按返回的数选句子，下面两种分支都核对）。30 层的目标 3 × 2 × 3 次生成要多花约 3 秒；整个词表的
    lm_head 每一行的乘加是这 3 层的两倍多（生成的每次前向、预填充的每个提示位置都算它），还要多花约半秒；4 层、2048 列比
    3 层、512 列多花约三分之一（prefill 的矩阵乘占了这个测试的大半）。
    """
    s, ctx, out = run
    small = layer_subset(ctx["target"], TIME_LAYERS)          # 一份浅拷贝：换它的 _head 不动目标
    small._head = np.ascontiguousarray(small._head[:, :TIME_VOCAB])
    assert s.STOP < TIME_VOCAB
    monkeypatch.setitem(ctx, "target", small)
    monkeypatch.setitem(ctx, "skip", layer_skip_draft(small, 1, 1))
    said = []
    monkeypatch.setattr(s, "print_observations", lambda obs: said.extend(obs))    # 观察的原文（不折行）
    asked, timing, called, got = [], s.demo7_timing, [], []
    for i, name in enumerate(("demo1_alphas", "demo2_tokens_per_call", "demo3_seed04_sentence", "demo4_prompt_lookup",
                              "demo5_trees", "demo6_cost"), 1):
        monkeypatch.setattr(s, name, lambda c, i=i: called.append(i) or out[f"d{i}"])
    monkeypatch.setattr(s, "demo7_timing",
                        lambda c, n: asked.append(n) or got.append(timing(c, n, repeats=3)) or got[-1])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        s.main(["--time", "2"])
    assert called == [1, 2, 3, 4, 5, 6] and asked == [2] and len(got) == 1
    assert ctx["_cost"] is out["d6"]
    res = got[0]
    assert "演示 7" in buf.getvalue() and "重复 3 次" in buf.getvalue()
    text = "".join(said)
    P, cfg = ctx["P"], ctx["cfg"]
    per_layer = sum(P["layers"][0][m].size for m in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down"))
    c_hat = ((cfg.n_layers - s.SKIP[1]) * per_layer + P["lm_head"].size) / (cfg.n_layers * per_layer
                                                                           + P["lm_head"].size)
    for (label, name), v in res.items():
        t = v["times"]
        base = res[(label, "普通 decode")]["times"]
        assert t.shape == (3,) and (t > 0).all() and 1 <= v["n"] <= 2
        assert v["median"] == sorted(t)[1]
        r = base / t
        assert v["ratio"] == sorted(r)[1] and v["ratio_range"] == (r.min(), r.max())
        if v["calls"] is None:
            assert v["pred"] == 1.0 and v["ratio"] == 1.0
        elif "lookup" in name:
            assert v["pred"] == pytest.approx(v["n"] / v["calls"], rel=1e-12)
        else:
            assert v["pred"] == pytest.approx(v["n"] / v["calls"] / (s.GAMMA_CORR * c_hat + 1), rel=1e-12)
    lk = res[("散文", "prompt lookup（自适应）")]
    lo, hi = lk["ratio_range"]
    assert f"测出来是 {lk['ratio']:.2f}×，3 次在 {lo:.2f}–{hi:.2f}× 之间" in text
    if lk["calls"] == res[("散文", "普通 decode")]["n"]:            # 调用次数一样：真实的比值 ≈ 1.00×
        assert "真实的比值就是 ≈ 1.00×" in text and "离 1.00× 的距离就是这台机器上计时的误差" in text
    cp = res[("照抄", "prompt lookup（自适应）")]
    assert ("最慢的一次也比散文那行的上限快" in text) == (cp["ratio_range"][0] > hi)
    monkeypatch.undo()
    assert ctx["target"] is not small and ctx["target"].cfg.n_layers == 30      # 别的测试用的 ctx 原样
    with pytest.raises(ValueError, match="重复次数"):
        s.demo7_timing(ctx, 2, repeats=0)


def test_printed_observations_cite_the_returned_figures(run):
    s, ctx, out = run
    text = script_stdout(S)
    al = out["d1"]["alphas"]
    assert f"跳过中间 {s.SKIP[1]} 层的 α = {al[ctx['skip_label']][0]:.3f}" in text
    assert f"只用前 {s.EXIT_K} 层的 α = {al[f'只用前 {s.EXIT_K} 层'][0]:.3f}" in text
    assert f"T = 0 的 {len(out['d2']['exact'])} 格里式 (1) 高估了 {len(out['d2']['over'])} 格" in text
    d3 = out["d3"]["per_draft"]
    neg = sum(v["err"] < 0 for v in d3.values())
    assert f"{neg} / {len(d3)} 个草稿的精确值低于式 (1)" in text
    assert out["d3"]["n_pairs"] == sum(len(new) - 1 for _, new in ctx["texts"])
    assert "演示 7" not in text                      # 默认运行不计时
    t3 = out["d1"]["t3"]
    assert "多半只差 0.01" not in text                # 旧的句子：表 3 的 T5 对差 0.11–0.18
    toy_r = out["d3"]["toy_r"]
    assert f"{len(toy_r)} 个草稿的 |r₁| ≤ {max(abs(r) for r in toy_r.values()):.2f}）" in text
    q8, q4 = out["d6"]["INT8 的自己"]["speedup"], out["d6"]["INT4-g32 的自己"]["speedup"]
    assert ("比 INT4-g32 还快" in text) == (q8 > q4) and ("不如 INT4-g32" in text) == (q8 <= q4)
    assert f"{t3['n_t5']} 对 T5（EnDe、CNNDM 各三个草稿）都是 T = 0 高 {t3['t5'][0]:.2f}–{t3['t5'][1]:.2f}" in text
    assert f"GPT-like 和 LaMDA 的 {t3['n_other']} 对两列最多差 {t3['other']:.2f}" in text
    d5 = out["d5"]
    assert "和 09 的 i.i.d. 候选一样：α 低时树赢、α 高时链好" not in text     # 旧的句子：说成了一般规律
    assert f"位置只有 {' 和 '.join(map(str, d5['budgets']))} 个、{len(s.TREES)} 种固定的形状" in text
    assert f"三段文本的 {d5['n_pos']} 个位置。它不是一般规律" in text
    assert d5["n_pos"] == sum(len(new) for _, new in ctx["texts"])
    size = {w: int(sum(np.cumprod(w))) for w in s.TREES}                  # 位置数 = 各层节点数之和
    assert d5["budgets"] == sorted(set(size.values()))
    pc = d5["per_call"]
    for n, m in d5["margin"].items():                                     # 树赢链最多多少（括号里的百分数）
        best = max(max(pc[(w, n)] for w in s.TREES if size[w] == b) / pc[((1,) * b, n)] for b in d5["budgets"])
        assert m == pytest.approx(best - 1, abs=1e-12) and m > 0
        assert f"最多 {m:+.0%}" in text
