"""
测试共用的 SmolLM2 模型：conftest.real_model 整个会话只装一次参数；这里在它上面每种 dtype 只建一次
decode_lab.TransformerLM（建的时候融合权重：float64 约 1 GB、1–2 秒），test_engine 和 test_serve 共用同一个。
"""
from conftest import real_model

_LM = {}


def smollm2_lm(dtype="float64"):
    """-> (TransformerLM, cfg, tokenizer)，每种 dtype 整个测试会话只建一次。"""
    if dtype not in _LM:
        from decode_lab import TransformerLM
        P, cfg, tok = real_model(dtype)
        _LM[dtype] = (TransformerLM(P, cfg), cfg, tok)
    return _LM[dtype]
