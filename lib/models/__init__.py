"""The one decoder and its parts.

- ``config``: every model configuration (the tiny test model, the 1.1B, Llama-3-8B) and how logits
  are compared.
- ``weights``: a decoder's weights and how random ones are drawn.
- ``batch``: ``StepBatch``, the rows of one forward pass (prefill chunks and decodes).
- ``layers``: the swappable parts (linear methods, norms, rotary, attention, heads) and the presets
  ``EAGER``, ``FUSED``, ``compiled()``, ``quantized()``.
- ``llama``: ``Llama``, the one layer loop.

Chapters: 5-10.
"""

from lib.models.config import CONFIGS, LLAMA3_8B, LOGITS_TOLERANCE, ModelConfig, check_logits, config_for
from lib.models.layers import EAGER, FUSED, Parts, compiled, quantized
from lib.models.llama import Llama, dequantized

__all__ = ["CONFIGS", "EAGER", "FUSED", "LLAMA3_8B", "LOGITS_TOLERANCE", "Llama", "ModelConfig", "Parts",
           "check_logits", "compiled", "config_for", "dequantized", "quantized"]
