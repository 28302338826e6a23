"""
测试共用的种子 04 的玩具模型（QCFG 的目标和四个草稿）：同一个构造函数整个测试会话只调一次。

几个测试文件各自要 drafts_lab.build_seed04_models() 或种子 04 自己的 build_models()；两者逐个参数相同由
test_decode_lab_papers.test_build_seed04_models_gives_seed04s_exact_models 核对。构造一次约 0.3 秒，几乎全花在给二元语法表
从目标采样的 64 × 128 个 token（quant_lab.sample_tokens，一次前向一个 token）上。

- built_by(builder)：按定义它的源文件和名字记（conftest.load_script 每次加载编号脚本都得到新的函数对象，04 的 build_models
  在两个测试文件里加载两次，也还是同一个）。构造是确定的（init_params 的种子 0、采样的种子 1），所以共用一份。
- 构造时它的 sample_tokens 经过一个按参数记住结果的包装（_remembering）：参数（P 按每个数组的内容、dtype 和形状，cfg，
  其余参数）完全相同时，第二个构造直接拿第一个采样的 token。两个构造调用的是同一个 quant_lab.sample_tokens，它只由参数
  决定（np.random.default_rng(seed)，不碰全局状态），所以拿到的和重新采样的逐位相同；参数有任何不同（例如另一个种子）
  就照样重新采样，上面那个核对照样变红。

模型建好以后不再变（TransformerLM / NGramLM 的前向不改自己的参数）；用它们的测试不改参数。built_by 给的 drafts 是共用的
dict，不能往里加减；seed04_models / seed04_script_models 每次给一份新的 dict。
"""
import hashlib

import numpy as np

_BUILT = {}
_TOKENS = {}          # sample_tokens 的参数 -> 它采样的 token

SEED04 = "lecture06/04_spec_decode_speedup.py"


def _key(P, cfg, args, kw):
    h = hashlib.sha256()
    for name, arr in sorted((k, v) for k, v in P.items() if k != "layers"):
        h.update(f"{name}|{arr.dtype}|{arr.shape}|".encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    for li, layer in enumerate(P["layers"]):
        for name, arr in sorted(layer.items()):
            h.update(f"{li}|{name}|{arr.dtype}|{arr.shape}|".encode())
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest(), repr(cfg), repr(args), repr(sorted(kw.items()))


def _remembering(real):
    """sample_tokens 的包装：同样的参数只采样一次，之后给那次结果的副本。"""
    def sample_tokens(P, cfg, *args, **kw):
        key = _key(P, cfg, args, kw)
        if key not in _TOKENS:
            _TOKENS[key] = real(P, cfg, *args, **kw)
        return _TOKENS[key].copy()
    return sample_tokens


def built_by(builder):
    """builder() 的结果（(target, drafts)），同一个构造函数整个会话只调一次；构造时它模块里的 sample_tokens 换成包装。"""
    key = (builder.__code__.co_filename, builder.__qualname__)
    if key not in _BUILT:
        g = builder.__globals__
        real = g.get("sample_tokens")
        if real is not None:
            g["sample_tokens"] = _remembering(real)
        try:
            _BUILT[key] = builder()
        finally:
            if real is not None:
                g["sample_tokens"] = real
    return _BUILT[key]


def seed04_models():
    """drafts_lab.build_seed04_models() -> (target, drafts)，整个会话只建一次（drafts 是新的 dict）。"""
    from drafts_lab import build_seed04_models
    target, drafts = built_by(build_seed04_models)
    return target, dict(drafts)


def seed04_script():
    """种子 04 脚本（按路径加载、不运行）-> 模块，整个会话只加载一次。"""
    if "script" not in _BUILT:
        from conftest import load_script
        _BUILT["script"] = load_script(SEED04)
    return _BUILT["script"]


def seed04_script_models():
    """种子 04 脚本自己的 build_models() -> (target, drafts)，整个会话只建一次（drafts 是新的 dict）。"""
    target, drafts = built_by(seed04_script().build_models)
    return target, dict(drafts)
