#!/usr/bin/env bash
# Show that `pip install autotune-loader` keeps the torch an environment already has (a
# CUDA build here): a scratch venv holds only a CUDA torch's metadata (torch 2.7.0+cu126,
# planted, no code), and pip resolves our wheel against the package index with --dry-run.
# Prints what pip would install; fails if torch is among it. Needs the index (PyPI).
#   scripts/check_install_keeps_torch.sh [WHEEL]   (default: builds one from this checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
TMP="$(mktemp -d /tmp/check-keeps-torch.XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
WHEEL="${1:-}"
if [ -z "$WHEEL" ]; then
  mkdir -p "$TMP/src" && (cd "$ROOT" && git ls-files -z --cached --others --exclude-standard \
    | while IFS= read -r -d '' f; do [ -f "$f" ] && cp --parents "$f" "$TMP/src/"; done)
  "$PY" -m pip wheel -q --no-deps -w "$TMP/dist" "$TMP/src" >/dev/null
  WHEEL="$(ls "$TMP"/dist/autotune_loader-*.whl)"
fi
"$PY" -m venv "$TMP/v"
SITE="$("$TMP/v/bin/python" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
mkdir -p "$SITE/torch-2.7.0+cu126.dist-info"
printf 'Metadata-Version: 2.1\nName: torch\nVersion: 2.7.0+cu126\n' \
  > "$SITE/torch-2.7.0+cu126.dist-info/METADATA"
: > "$SITE/torch-2.7.0+cu126.dist-info/RECORD"
echo "environment: $("$TMP/v/bin/python" -m pip list 2>/dev/null | grep -i '^torch ')"
echo "+ pip install --dry-run --report r.json $(basename "$WHEEL")"
"$TMP/v/bin/python" -m pip install -q --dry-run --report "$TMP/r.json" "$WHEEL" \
  2> >(grep -v "^WARNING: Location" >&2)
"$TMP/v/bin/python" - "$TMP/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
names = sorted(f"{i['metadata']['name']}=={i['metadata']['version']}" for i in r["install"])
print(f"pip would install {len(names)}: {' '.join(names)}")
torch = [n for n in names if n.lower().split("==")[0] in ("torch", "torchvision")]
if torch:
    sys.exit(f"FAIL: pip would replace the environment's torch with {torch}")
print("ok: torch 2.7.0+cu126 is kept (not in the install list)")
PY
