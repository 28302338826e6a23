"""
测试共用的种子 04 的玩具模型：drafts_lab.build_seed04_models 和种子脚本自己的 build_models 整个测试会话各只建一次
（每次约 0.3 秒，几乎全花在二元语法表要拟合的、从目标采样的 64 × 128 个 token 上）。两份逐个参数相同由
test_decode_lab_papers.test_build_seed04_models_gives_seed04s_exact_models 核对。

模型建好以后不再变（TransformerLM / NGramLM 的前向不改自己的参数）；用它们的测试不改参数。drafts 的 dict 每次给一份新的，
往里加减草稿不影响别的测试。
"""
_BUILT = {}

SEED04 = "lecture06/04_spec_decode_speedup.py"


def seed04_models():
    """drafts_lab.build_seed04_models() -> (target, drafts)，整个会话只建一次。"""
    if "lab" not in _BUILT:
        from drafts_lab import build_seed04_models
        _BUILT["lab"] = build_seed04_models()
    target, drafts = _BUILT["lab"]
    return target, dict(drafts)


def seed04_script():
    """种子 04 脚本（按路径加载、不运行）-> 模块，整个会话只加载一次。"""
    if "script" not in _BUILT:
        from conftest import load_script
        _BUILT["script"] = load_script(SEED04)
    return _BUILT["script"]


def seed04_script_models():
    """种子 04 脚本自己的 build_models() -> (target, drafts)，整个会话只建一次。"""
    if "script_models" not in _BUILT:
        _BUILT["script_models"] = seed04_script().build_models()
    target, drafts = _BUILT["script_models"]
    return target, dict(drafts)
