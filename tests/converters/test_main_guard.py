"""convert() from a script without `if __name__ == "__main__":`: its workers import the
script, which calls convert() again. Before, the user saw "another `autotune convert` is
writing here" from the child and "Connection reset by peer" from the converter; now both
lines name the missing guard (real workers, a real script in a fresh interpreter)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from autotune.synth import make_image_folder

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, tmp: Path) -> subprocess.CompletedProcess:
    (tmp / "conv.py").write_text(script)
    return subprocess.run([sys.executable, "conv.py"], cwd=tmp, capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


SCRIPT = """from autotune_converters import convert, ConvertOptions
convert("src", "dst", ConvertOptions(format="wds", workers=2))
print("converted")
"""


def test_no_main_guard_is_named(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", 12, 2, seed=1)
    r = _run(SCRIPT, tmp_path)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("autotune_base.errors.ConvertError: a worker process died"), last
    assert 'if __name__ == "__main__":' in last
    assert "convert() was called again by a child of the conversion" in r.stderr
    assert "Connection reset" not in r.stderr
    assert not (tmp_path / "dst" / "manifest.json").exists()


def test_with_the_guard_it_converts(tmp_path: Path) -> None:
    make_image_folder(tmp_path / "src", 12, 2, seed=1)
    guarded = 'if __name__ == "__main__":\n' + "".join(
        "    " + line + "\n" for line in SCRIPT.strip().splitlines()[1:])
    r = _run(SCRIPT.splitlines()[0] + "\n" + guarded, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "converted" in r.stdout
    assert (tmp_path / "dst" / "manifest.json").is_file()
