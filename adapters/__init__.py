"""Adapters that plug fa4cache into other libraries (installed as ``fa4cache.adapters``)."""
