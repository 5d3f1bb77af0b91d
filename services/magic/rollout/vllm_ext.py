"""A vLLM worker extension the rollout engine relies on, loaded into vLLM's workers with
`--worker-extension-cls magic.rollout.vllm_ext.MagicWorkerExtension` and called through
`POST /collective_rpc`.

It imports nothing from `magic` but this module, so it runs in vLLM's own interpreter (the
separate `.venv-vllm` locally, the vLLM image on a pod).

`refresh_cpu_head` — the fix for reloads of tied-embedding models on vLLM's CPU backend.
At load time the CPU backend prepacks the weight of every embedding-shaped linear layer
(`UnquantizedEmbeddingMethod.process_weights_after_loading` →
`vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`), and `lm_head` then computes
its logits from that packed copy (`layer.cpu_linear`). `Worker.reload_weights` writes the new
values into `weight` but leaves the packed copy as it was, so a tied model (Qwen2.5-0.5B/1.5B,
the demo model) samples with the new body and the *old* head. Re-running the dispatch on the
head after a reload packs the new weight. GPU backends compute from `weight` directly; there
the call is a no-op (no `cpu_linear`).
"""

from __future__ import annotations


class MagicWorkerExtension:
    """Mixed into vLLM's worker class (`self` is the worker: `self.model_runner` is its model runner)."""

    def refresh_cpu_head(self) -> list[str]:
        """Re-pack the CPU GEMM copy of every embedding / output-head layer from its current weight;
        returns the names of the layers re-packed (empty off the CPU backend)."""
        import torch
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
        from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

        model = self.model_runner.get_model()
        refreshed = []
        seen: set[int] = set()
        for name, module in model.named_modules(remove_duplicate=False):
            if id(module) in seen or not isinstance(module, VocabParallelEmbedding) or not hasattr(module, "cpu_linear"):
                continue
            seen.add(id(module))
            weight = getattr(module, "weight", None)
            if isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.numel() > 0:
                dispatch_cpu_unquantized_gemm(module, remove_weight=False)
                refreshed.append(name)
        return refreshed
