"""Shared fixtures. Tests never touch the internet: servers they need are started here on 127.0.0.1."""
