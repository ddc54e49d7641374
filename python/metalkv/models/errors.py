"""The error every model loader raises. A module of its own, imported by the
others in models/ and by nothing they define, so it sits below all of them."""


class ModelLoadError(ValueError):
    """A model could not be found, read or understood. The message names the
    file, tensor or key that was wrong and what was expected."""
