"""`strata quality`: what a quantisation costs in quality, measured on this host.

Perplexity of a model over a text (llama.cpp's perplexity convention, see chunks.py) on the
llama.cpp and torch backends, and against a reference model of the same vocabulary: the KL
divergence of the next-token distributions, top-1 agreement and the decode speed ratio from
stored `strata bench` results — the quantisation frontier.

  text.py       the text: stdlib's pydoc topics by default (offline), or --text FILE
  tokenizer.py  the model's own tokenizer, by a registry of schemes (synthetic, GGUF, HF)
  chunks.py     the chunking and which positions are scored
  metrics.py    log-softmax, NLL, KL, top-1 per chunk; summaries (pure numpy)
  scorers.py    per-backend logits, the same weights on every backend
  speed.py      decode speed ratio from stored bench results
  requant.py    re-quantise a GGUF (same names and metadata) for like-for-like comparisons
  run.py        the whole measurement: checks first, then chunks through the backends
"""

from strata.quality.run import QualityConfig, QualityResult, prepare, run_quality

__all__ = ["QualityConfig", "QualityResult", "prepare", "run_quality"]
