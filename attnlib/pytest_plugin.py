"""The course's pytest options, registered as a plugin (entry point ``pytest11`` in pyproject.toml).

Why not only in conftest.py: pytest reads a root conftest's options only after it has decided
which paths to collect, and in ``pytest --impl /some/folder -m step04`` it would take the
folder for a test path (and then stop at "unrecognized arguments: --impl"). A plugin installed
with the course (``make setup`` runs ``pip install -e .``) is known before the arguments are parsed,
so ``--impl PATH`` and ``--impl=PATH`` both work, for a folder anywhere.

Nothing here imports torch: the plugin loads in every pytest run of the course's environment.
"""

IMPL_HELP = "steps (default), solutions, or a folder shaped like steps/ (relative or absolute)"


def add_impl_option(parser):
    """Add ``--impl`` unless another copy of this hook already did (plugin and conftest both try)."""
    try:
        parser.addoption("--impl", default=None, help=IMPL_HELP)
    except ValueError:          # "option names {'--impl'} already added"
        pass


def course_installed() -> bool:
    """`make setup` installs the course (`pip install -e .`); a bare GPU image (make gpu-check) does not."""
    from importlib import metadata
    try:
        metadata.distribution("attention-course")
        return True
    except metadata.PackageNotFoundError:
        return False


def not_installed_mark():
    """A skip mark for the tests that need the course installed (its package, this plugin)."""
    import pytest
    return pytest.mark.skipif(not course_installed(),
                              reason="the course is not installed here (`make setup` runs `pip install -e .`)")


def pytest_addoption(parser):
    add_impl_option(parser)
