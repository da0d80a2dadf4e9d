"""The tiny MoE GPT, NVFP4 quantization, checkpoint I/O, CPU shims."""
