"""GPT-2 experiments behind ``fpsim experiment`` (installed with fpsim, tiny checkpoint included).

They need the ``experiments`` extra (torch, matplotlib, safetensors, tqdm); the core package
``fpsim`` never imports them.
"""
