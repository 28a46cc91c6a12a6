"""What binds FA4 to the store: its compile caches (:mod:`fa4cache.adapters.fa4.compile_cache`), the patch of its
modules (:mod:`.patch`), its keys (:mod:`.keys`, :mod:`.key_names`), exported artifacts, and
the cross-compiling and masking helpers FA4's kernels need. Nothing here starts processes.
"""
