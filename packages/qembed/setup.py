"""setuptools' view of paddle-quant-embed (the metadata is in pyproject.toml): the wheel is a platform wheel,
tagged for this Python and platform, exactly when the build put the compiled op in ``src/qembed/lib/``
(``wheel_backend.py``); otherwise it is pure Python."""

from pathlib import Path

from setuptools import Distribution, setup


class _Distribution(Distribution):
    def has_ext_modules(self) -> bool:
        return any((Path(__file__).resolve().parent / "src" / "qembed" / "lib").glob("*.so"))


setup(distclass=_Distribution)
