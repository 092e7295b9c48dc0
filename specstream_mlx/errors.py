"""The one exception type users of the library and the CLI see for bad input."""


class SpecstreamError(Exception):
    """Bad input or an unusable model/adapter; the message is meant for the user, on one line."""
