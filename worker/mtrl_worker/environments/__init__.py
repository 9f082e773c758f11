"""Environments: the plug-in interface, the registry and the built-in environments."""
