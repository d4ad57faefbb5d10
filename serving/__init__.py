"""Serving `.tcpkg` packages: `tcpkg serve` (KServe / Open Inference Protocol v2 over HTTP), and bridges to the
serving engines people already run (a Triton Inference Server model repository, a Ray Serve deployment).

Installed as ``tcexport.serving`` with the ``[serve]`` extra. It sits above the loader: it imports the loader and
the format, never the exporter, torch or the packager.
"""
