"""Every script and companion loads from its path alone, as a copied file is loaded with importlib
(not registered in sys.modules: a quoted dataclass annotation, for one, fails there)."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", sorted(ROOT.glob("*.py")), ids=lambda p: p.stem)
def test_script_loads_from_its_path(path):
    spec = importlib.util.spec_from_file_location(f"copied_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # importing must not start training
    assert module.__doc__
