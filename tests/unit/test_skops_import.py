"""`twinserve.load_sklearn` does not import torch: skops.io's import would, where torch is installed.

Measured 2026-12-05 with the torch extra installed: `import skops.io` took 3.5 s and left 231 MiB of private
memory (USS) in the process, torch among its modules; through `load_sklearn`, 1.9 s and 99 MiB. Each check runs
in a fresh interpreter, since an import happens once a process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

SAVE = textwrap.dedent(
    """
    import sys
    import skops.io, sklearn.datasets, sklearn.tree
    X, y = sklearn.datasets.load_iris(return_X_y=True)
    skops.io.dump(sklearn.tree.DecisionTreeClassifier(max_depth=2).fit(X, y), sys.argv[1])
    print("torch" in sys.modules)
    """
)
LOAD = textwrap.dedent(
    """
    import sys
    import twinserve
    clf = twinserve.load_sklearn(sys.argv[1], trusted=["sklearn.tree._tree.Tree"])
    print(clf.predict([[5.1, 3.5, 1.4, 0.2]])[0], "torch" in sys.modules)
    """
)


def _run(code: str, *args: str) -> str:
    done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_load_sklearn_leaves_torch_unimported(tmp_path: Path) -> None:
    model = tmp_path / "iris.skops"
    # The premise: skops.io on its own imports torch (if a release stops doing so, this test says so).
    assert _run(SAVE, str(model)) == "True"
    assert _run(LOAD, str(model)) == "0 False"
