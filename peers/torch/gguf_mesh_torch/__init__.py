"""gguf-mesh's PyTorch peer: a second, independent implementation of the wire protocol
(docs/protocol.md) with its own GGUF reader, dequantisation and llama/qwen2/qwen3 layers."""

__version__ = "0.1.0"
