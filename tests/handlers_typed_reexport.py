"""A typed job function imported from another module: a worker that allows only this one
must not run it (the allow-list decides by the module that defines the function)."""

from tests.handlers_typed import add

__all__ = ["add"]
