"""GGUF checkpoints (the single-file format of llama.cpp and Ollama): header, dequantization, name mapping.

``file`` parses the header and reads tensor bytes; ``dequant`` turns stored blocks into float arrays with the
``gguf`` package; ``arch`` describes, as data, how one GGUF architecture maps onto a family (config keys, tensor
names, per-tensor transforms); ``tensors`` exposes a file's tensors under their Hugging Face names, the way
app/checkpoint.py's ``TensorIndex`` exposes a safetensors folder.
"""
