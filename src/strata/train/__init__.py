"""`strata train`: a small Llama trained from scratch on the lab's kernels, then exported.

Modules: presets (sizes), data (corpus, split, token files, batches), tokenizer (byte-level
BPE), model (the Llama over an `Ops` protocol), ops_torch (the plain-PyTorch ops), export
(Hugging Face folder and GGUF). Importing this package imports nothing heavy: torch,
tokenizers and numpy load with the submodules that need them (docs/architecture.md §2).
"""
