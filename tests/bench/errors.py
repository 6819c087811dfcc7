"""The benchmark's one error."""


class BenchError(Exception):
    """A measurement that cannot be trusted: a plugin failed a call, exited, or never came up."""
