"""Presets and search spaces, installed as the package `autotune_configs` (package data)."""
