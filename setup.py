"""The wheel carries what a checkout keeps outside the package: the launch scripts, Horovod's
patches and the docs, copied under hvdtrain/shipped/, where hvdtrain.install.shipped finds them.
Everything else is in pyproject.toml."""
import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

sys.path.insert(0, str(Path(__file__).parent))
from hvdtrain.install.shipped import CHECKOUT_FOLDERS  # noqa: E402  (imports nothing else)


class BuildPyWithShipped(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads them from the checkout
            return
        for name, source in CHECKOUT_FOLDERS.items():
            target = Path(self.build_lib) / "hvdtrain" / "shipped" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(source, target)


setup(cmdclass={"build_py": BuildPyWithShipped})
