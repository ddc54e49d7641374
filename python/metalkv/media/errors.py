"""The error media/ raises for media a caller gave (defined with metalkv's other errors, in
metalkv/errors.py): a module of its own, below every other in media/, so each can raise it."""
from ..errors import MediaError

__all__ = ["MediaError"]
