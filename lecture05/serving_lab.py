"""
serving_lab —— 旧的总入口：第 5 讲的实验模块按用途拆开了，这里只按原来的名字把它们转出来（不放任何逻辑）。

新代码直接 import 各个模块：
- iteration_lab：一次迭代的 roofline 时间（iteration_time、iteration_clock、knee_chunk）、link_time、step_time；
- workload_lab：确定的请求流（poisson_arrivals、uniform_ints）；
- batching_lab：静态批 vs 连续批（simulate_batching）；
- disagg_lab：prefill / decode 同机 vs 解耦（simulate_colocated、simulate_disaggregated 和快速版 fast_*）；
- goodput_lab：SLO 达标率、goodput、prefill 的能力上限（slo_attainment、find_goodput、prefill_capacity）；
- paging_lab：KV 内存的分配（simulate_kv_allocation）。
第 5 讲 06 打印的句子里还写着 serving_lab.prefill_capacity、serving_lab.knee_chunk：这里的名字让它们仍然成立。
"""
from batching_lab import simulate_batching
from disagg_lab import fast_colocated, fast_disaggregated, simulate_colocated, simulate_disaggregated
from goodput_lab import find_goodput, prefill_capacity, slo_attainment
from iteration_lab import iteration_time, knee_chunk, link_time, step_time
from paging_lab import simulate_kv_allocation
from workload_lab import poisson_arrivals, uniform_ints

__all__ = ["iteration_time", "link_time", "step_time", "poisson_arrivals", "uniform_ints",
           "simulate_batching", "simulate_colocated", "simulate_disaggregated"]
__all__ += ["fast_colocated", "fast_disaggregated", "slo_attainment", "find_goodput", "prefill_capacity",
            "knee_chunk"]
__all__ += ["simulate_kv_allocation"]
