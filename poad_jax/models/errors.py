"""The one error type a user can cause while loading a model."""


class ModelLoadError(Exception):
    """A model could not be loaded; the message is one line that says why and what to do.

    Raised for a missing path, an unsupported architecture or quantisation, a
    missing wheel (the message holds the pip command), a corrupt file and a
    sha256 mismatch.
    """
