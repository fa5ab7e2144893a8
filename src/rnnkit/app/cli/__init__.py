"""The ``rnnkit`` command line: parses options and calls the library, nothing more."""
