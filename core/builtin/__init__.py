"""Plugins that ship inside acc-core: the default `cpu` backend."""
