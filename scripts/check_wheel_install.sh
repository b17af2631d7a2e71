#!/usr/bin/env bash
# The install a user does, checked end to end (not a test: it installs from the index and
# takes minutes). Builds the wheel from a clean copy of this checkout, makes a fresh venv
# outside it, installs torch there first (TORCH, pip requirements or wheel files, split at
# spaces, e.g. a CUDA torch with its torchvision as a GPU user has them; the
# default takes what pip finds for `torch>=2.1`), then the wheel with its dependencies, and
# from a folder outside the checkout runs:
#   autotune --help; search --trials 1; convert (wds and lmdb); stage; one epoch of
#   autotune.DataLoader with two workers (every sample once, the folder's labels);
#   autotune.open_dataset over the folder, the staged WebDataset and the LMDB (two
#   workers: every sample once with the folder's bytes and label; two epochs of a plain
#   training loop).
#   TORCH=torch==2.6.0 scripts/check_wheel_install.sh
#   TORCH='torch==2.1.2 numpy<2' scripts/check_wheel_install.sh   (torch < 2.3 needs numpy 1)
#   TORCH='torch==2.14.1 torchvision==0.29.1' scripts/check_wheel_install.sh
# On a CPU-only machine give TORCH a CPU build (torch==2.13.0 here): the index's default
# torch is a CUDA build of several GB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
TORCH="${TORCH:-torch>=2.1}"
TMP="$(mktemp -d /tmp/check-wheel.XXXXXX)"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$TMP"' EXIT
say() { echo "[check-wheel] $*" >&2; }

mkdir -p "$TMP/src"
(cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [ -f "$f" ] && cp --parents "$f" "$TMP/src/"; done)
"$PY" -m pip wheel -q --no-deps -w "$TMP/dist" "$TMP/src" >/dev/null
WHEEL="$(ls "$TMP"/dist/autotune_loader-*.whl)"
say "built $(basename "$WHEEL")"

"$PY" -m venv "$TMP/v"
V="$TMP/v/bin"
quiet() { grep -v "^WARNING: Location" >&2 || true; }
read -r -a torch_reqs <<< "$TORCH"
"$V/python" -m pip install -q "${torch_reqs[@]}" 2> >(quiet)
say "torch $("$V/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"
"$V/python" -m pip install -q "$WHEEL" 2> >(quiet)
say "after installing the wheel: torch $("$V/python" -c 'import torch; print(torch.__version__)' 2>/dev/null)"

cd "$TMP"
unset PYTHONPATH
"$V/autotune" --help >/dev/null
"$V/python" -c "from autotune.synth import make_image_folder as m; m('ds/train', 96, 4, seed=1, workers=1)"
"$V/autotune" -q search ds/train --trials 1 --no-probe --confirm 0 --seconds 1 --warm \
  --batch-size 4 --compute-ms 0 --space small --out out/search --json out/search.json >/dev/null
say "search --trials 1: $("$V/python" -c "import json; d=json.load(open('out/search.json')); print('recommended', d['recommended']['config'])")"
"$V/autotune" -q convert ds/train out/wds --format wds --workers 2 --shard-size 64K >/dev/null
"$V/autotune" -q convert ds/train out/lmdb --format lmdb --workers 2 >/dev/null
"$V/autotune" -q stage out/wds out/staged-wds >/dev/null
say "convert (wds, lmdb) and stage: done"
"$V/python" - <<'EOF'
import collections, os
import torch
from PIL import Image
import autotune

root = "ds/train"
classes = sorted(os.listdir(root))
items = [(os.path.join(root, c, f), i) for i, c in enumerate(classes)
         for f in sorted(os.listdir(os.path.join(root, c)))]

class Folder(torch.utils.data.Dataset):
    def __len__(self): return len(items)
    def __getitem__(self, i):
        path, label = items[i]
        with Image.open(path) as im:
            return torch.tensor(im.size), label, i

seen = collections.Counter()
for size, label, idx in autotune.DataLoader(Folder(), batch_size=8, shuffle=True, num_workers=2):
    for l, i in zip(label.tolist(), idx.tolist()):
        assert l == items[i][1]
        seen[i] += 1
assert sorted(seen) == list(range(len(items))) and set(seen.values()) == {1}
print(f"[check-wheel] autotune.DataLoader: one epoch, {len(items)} samples once each, labels of the folder")

import hashlib

import numpy as np

# What each sample must be: the folder's file bytes with the folder's label.
want = collections.Counter((hashlib.sha1(open(p, "rb").read()).hexdigest(), l) for p, l in items)


def to_tensor(im):
    im = im.resize((16, 16))
    return torch.from_numpy(np.array(im)).permute(2, 0, 1).float() / 255


for path in ("ds/train", "out/staged-wds", "out/lmdb"):
    # The bytes and labels, each sample once, through two DataLoader workers.
    raw = autotune.open_dataset(path, decode=False, shuffle=False, num_workers=2)
    got = collections.Counter()
    for blob, label in torch.utils.data.DataLoader(raw, batch_size=None, num_workers=2):
        got[(hashlib.sha1(bytes(blob)).hexdigest(), int(label))] += 1
    assert got == want, (path, sum(got.values()), len(want))
    # A plain training loop over the decoded images, two epochs, two workers.
    ds = autotune.open_dataset(path, transform=to_tensor, num_workers=2)
    iterable = isinstance(ds, torch.utils.data.IterableDataset)
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2,
                                         shuffle=None if iterable else True)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 16 * 16, len(ds.classes)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        if hasattr(ds, "set_epoch"):
            ds.set_epoch(epoch)
        n = 0
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            n += len(y)
        assert n == len(items), (path, epoch, n)
    print(f"[check-wheel] autotune.open_dataset({path}): {len(items)} samples once each with "
          f"the folder's bytes and labels; two epochs of a training loop (loss {loss.item():.2f})")
EOF
say "ok"
