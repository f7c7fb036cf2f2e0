"""cclz from Python. `import cclz.torch` registers the torch.distributed
backend "cclz" and gives the DDP compression hook (cclz.torch.hook)."""
