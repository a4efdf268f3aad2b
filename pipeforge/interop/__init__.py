"""interop: other tools' schedule formats. ``torch_csv`` (torch.distributed.pipelining's CSV), ``trace`` (Chrome/Perfetto)."""
