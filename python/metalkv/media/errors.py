"""The error media/ raises for media a caller gave: a module of its own, below every other in
media/, so that each of them can raise it and a server can answer it with a 400."""


class MediaError(ValueError):
    """An image or audio clip that cannot be used: the message starts with `[image]` or `[audio]`,
    names what was given (a path, a data URL, bytes), says what was wrong and what to do."""
