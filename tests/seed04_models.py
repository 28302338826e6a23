"""
测试共用的种子 04 的玩具模型：drafts_lab.build_seed04_models 和种子脚本自己的 build_models 整个测试会话各只建一次。
两份逐个参数相同由 test_decode_lab_papers.test_build_seed04_models_gives_seed04s_exact_models 核对。

建一次约 0.3 秒，几乎全花在二元语法表要拟合的、从目标采样的 64 × 128 个 token（quant_lab.sample_tokens）上。两个构造
各自调用 sample_tokens；这里让两次调用经过同一个按参数记住结果的包装（_remembering）：参数（P 按每个数组的内容、dtype
和形状，cfg，其余参数）完全相同时第二次直接拿第一次的 token。sample_tokens 只由参数决定（np.random.default_rng(seed)，
不碰全局状态），所以拿到的和重新采样的逐位相同；参数有任何不同（例如另一个种子）就照样重新采样，上面那个核对照样变红。

模型建好以后不再变（TransformerLM / NGramLM 的前向不改自己的参数）；用它们的测试不改参数。drafts 的 dict 每次给一份新的，
往里加减草稿不影响别的测试。
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


def seed04_models():
    """drafts_lab.build_seed04_models() -> (target, drafts)，整个会话只建一次。"""
    if "lab" not in _BUILT:
        import drafts_lab
        real = drafts_lab.sample_tokens
        drafts_lab.sample_tokens = _remembering(real)
        try:
            _BUILT["lab"] = drafts_lab.build_seed04_models()
        finally:
            drafts_lab.sample_tokens = real
    target, drafts = _BUILT["lab"]
    return target, dict(drafts)


def seed04_script():
    """种子 04 脚本（按路径加载、不运行；这份模块只在这里用，它的 sample_tokens 换成 _remembering 包装的）-> 模块。"""
    if "script" not in _BUILT:
        from conftest import load_script
        mod = load_script(SEED04)
        mod.sample_tokens = _remembering(mod.sample_tokens)
        _BUILT["script"] = mod
    return _BUILT["script"]


def seed04_script_models():
    """种子 04 脚本自己的 build_models() -> (target, drafts)，整个会话只建一次。"""
    if "script_models" not in _BUILT:
        _BUILT["script_models"] = seed04_script().build_models()
    target, drafts = _BUILT["script_models"]
    return target, dict(drafts)
