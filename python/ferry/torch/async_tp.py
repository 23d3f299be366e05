"""torch.compile's async tensor parallelism on ferry's fused ops:

    import ferry.torch
    ferry.torch.enable_async_tp()          # or enable_async_tp(tp_group)
    model = torch.compile(model)

Inductor's micro-pipeline TP pass (torch._inductor.config._micro_pipeline_tp) finds
all_gather -> matmul and matmul -> reduce_scatter in a compiled graph and replaces them with
torch.ops.symm_mem.fused_*. A post-grad pass of ours then points those nodes at
torch.ops.ferry.fused_* (fused_ops.py), which have the same schemas, so the fused ops run on the
group's backend (ferry for CUDA tensors under "cpu:gloo,cuda:ferry"). The group must be marked for
symmetric memory in torch's registry, which is how the pass decides where to fuse; this does it.
"""

import warnings

import torch

__all__ = ["enable_async_tp", "FerryFusedOps"]


def _targets():
    import torch.distributed._symmetric_memory  # noqa: F401  (defines torch.ops.symm_mem.*)

    from ferry.torch import fused_ops  # noqa: F401  (defines torch.ops.ferry.*)

    names = ("fused_all_gather_matmul", "fused_all_gather_scaled_matmul", "fused_matmul_reduce_scatter",
             "fused_scaled_matmul_reduce_scatter")
    return {getattr(torch.ops.symm_mem, n).default: getattr(torch.ops.ferry, n).default for n in names}


class FerryFusedOps(torch._inductor.custom_graph_pass.CustomGraphPass):
    """The post-grad pass: torch.ops.symm_mem.fused_* -> torch.ops.ferry.fused_*; then the pass
    that was installed before it, if any. `rewritten` counts the nodes it changed."""

    def __init__(self, then=None):
        self.then = then
        self.rewritten = 0
        self._targets = _targets()

    def __call__(self, graph):
        for node in graph.nodes:
            if node.op == "call_function" and node.target in self._targets:
                node.target = self._targets[node.target]
                self.rewritten += 1
        if self.then is not None:
            self.then(graph)

    def uuid(self):
        # Inductor's cache key: this file, and the pass after it.
        mine = torch._inductor.custom_graph_pass.get_hash_for_files((__file__,))
        theirs = self.then.uuid() if hasattr(self.then, "uuid") else repr(self.then)
        return (mine, theirs)


def enable_async_tp(group=None):
    """Turns on Inductor's micro-pipeline TP for `group` (a ProcessGroup or its name; default the
    world) with ferry's fused ops; returns the installed pass. Call it before torch.compile runs."""
    import torch.distributed as dist
    import torch.distributed._symmetric_memory as torch_symm
    from torch._inductor import config

    if group is None:
        group = dist.group.WORLD
    if group is None:
        raise RuntimeError("ferry.torch.enable_async_tp: torch.distributed is not initialized "
                           "(call init_process_group first)")
    with warnings.catch_warnings():
        # Newer torch marks every group and deprecates the call; older torch needs it.
        warnings.simplefilter("ignore", FutureWarning)
        torch_symm.enable_symm_mem_for_group(group if isinstance(group, str) else group.group_name)
    config._micro_pipeline_tp = True
    current = config.post_grad_custom_post_pass
    if not isinstance(current, FerryFusedOps):
        config.post_grad_custom_post_pass = FerryFusedOps(current)
    return config.post_grad_custom_post_pass
