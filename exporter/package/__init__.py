"""The exporter's last room: the pipeline's results → the manifest and the member bytes, handed to
``tcexport.packager.Package`` (the archive writer, which knows nothing of the exporter).

In the order a package is put together: ``exprs`` (sympy sizes → the manifest's expression form), ``members``
(where each generated member lives in the archive), ``weights`` (weights → safetensors), ``cuda`` (a graph's launch
list and cubin members), ``training`` (the ``--backward`` section), ``interface`` (what the CPU library is built
for: compiled into it as its descriptor and written into the manifest), ``build`` (the manifest and members of one
export: ``package(results, model_name)``).
"""
