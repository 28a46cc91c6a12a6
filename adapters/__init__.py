"""Adapters that plug fa4cache into other libraries (installed as ``fa4cache.adapters``)."""

if __name__ != "fa4cache.adapters":
    # From the repository root, ``import adapters`` would load a second copy of these modules with
    # their own state (installed patches, registries) beside ``fa4cache.adapters``.
    raise ImportError(
        f"import fa4cache.adapters, not {__name__}: this package is installed as fa4cache.adapters"
    )
