"""Adapters: the only modules that touch the frameworks' private names (one per framework)."""
