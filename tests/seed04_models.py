"""
测试共用的种子 04 的玩具模型（QCFG 的目标和四个草稿）：同一个构造函数整个测试会话只调一次。

几个测试文件各自要 drafts_lab.build_seed04_models() 或种子 04 自己的 build_models()；每次构造约 0.2–0.3 秒，
几乎全花在给二元语法表采样 64 × 128 个 token（quant_lab.sample_tokens，一次前向一个 token）。构造是确定的
（init_params 的种子 0、采样的种子 1），所以同一个构造函数的结果整个会话共用一份。不同的构造函数各存各的：
测试拿 04 的 build_models 和 drafts_lab 的比（test_lecture06_09.test_builder_matches_seed04_construction），
或者用 04 的那个当独立的另一条路径，这些都不变。调用者不能改这些模型（和模块级的 fixture 一样，整个会话共用）。
"""

_BUILT = {}


def built_by(builder):
    """
    builder() 的结果（(target, drafts)），同一个构造函数整个会话只调一次。
    按定义它的源文件和名字记：conftest.load_script 每次加载编号脚本都得到一个新的模块对象（新的函数对象），
    04 的 build_models 在两个测试文件里加载两次，也还是同一个。
    """
    key = (builder.__code__.co_filename, builder.__qualname__)
    if key not in _BUILT:
        _BUILT[key] = builder()
    return _BUILT[key]
