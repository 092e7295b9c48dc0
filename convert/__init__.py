"""The PyTorch path of specstream: the same Speculative Streaming model on Hugging Face
transformers (CUDA or CPU) to train adapters where big models are trained and check parity with
the MLX runtime, and the converter between PyTorch (PEFT) adapter folders and MLX ones.

Installed as `specstream_convert` (`pip install 'specstream-mlx[torch]'`); run from a checkout
as `python -m convert.<module>`. torch, transformers and peft are imported only here:
`specstream_mlx` stays free of torch. The format conversion (adapter_format) needs neither torch
nor MLX, only numpy and safetensors.
"""
