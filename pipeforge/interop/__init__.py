"""interop: other tools' schedule formats: ``torch_csv`` (torch.distributed.pipelining's CSV), ``chrome_trace``
(Chrome/Perfetto)."""
