"""CPU reference engine: a small Llama forward in PyTorch with real speculative decoding
(draft model, Medusa heads, EAGLE head), KV caches with exact rollback, prefix reuse and
in-flight batching, behind the ``tensorrt_llm`` tensor contract (see ``api``)."""
