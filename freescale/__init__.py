"""FreeScale: bubble-free distributed training for sequence recommendation models.

The product's folders live at the repository root (``pipeline/``, ``trainer/``, ``kernels/``,
``datasets/``, ``tools/``) and are installed as ``freescale.pipeline``, ``freescale.trainer``, ...
"""

__version__ = "0.1.0"
